// The console's own script: live parts of pages, following a log, local times, confirmations
// and the reserve form's price. No framework; loaded with `defer` from the binary.
"use strict";
(function () {
  const LIVE_HEADER = "X-Gpurent-Live";

  // Times are sent in UTC; each is shown in the browser's time zone.
  function localTimes(root) {
    const lang = document.documentElement.lang || undefined;
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      const d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d.getTime())) {
        el.title = el.getAttribute("datetime");
        el.textContent = d.toLocaleString(lang);
      }
    });
  }

  // `data-live="MS"`: the element is fetched again every MS milliseconds and replaced when it
  // changed (the page's own URL; the server renders the same page).
  function live() {
    const parts = Array.from(document.querySelectorAll("[data-live][id]"));
    if (parts.length === 0) return;
    const every = Math.max(500, Math.min.apply(null, parts.map(function (p) {
      return parseInt(p.getAttribute("data-live"), 10) || 2000;
    })));
    let busy = false;
    async function refresh() {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const r = await fetch(location.href, { headers: { [LIVE_HEADER]: "1" }, credentials: "same-origin", cache: "no-store" });
        if (r.status === 401) { location.assign("/login?next=" + encodeURIComponent(location.pathname)); return; }
        if (!r.ok) return;
        const doc = new DOMParser().parseFromString(await r.text(), "text/html");
        parts.forEach(function (el) {
          const fresh = doc.getElementById(el.id);
          if (fresh && fresh.innerHTML !== el.dataset.rendered) {
            const before = statusOf(el);
            el.dataset.rendered = fresh.innerHTML;
            el.innerHTML = fresh.innerHTML;
            localTimes(el);
            const after = statusOf(el);
            if (after !== before) {
              document.dispatchEvent(new CustomEvent("gpurent:status", { detail: { status: after } }));
            }
          }
        });
      } catch (e) {
        // A network blip: the next round tries again.
      } finally {
        busy = false;
      }
    }
    parts.forEach(function (el) {
      const doc = new DOMParser().parseFromString("<body>" + el.innerHTML + "</body>", "text/html");
      el.dataset.rendered = doc.body.innerHTML;
    });
    setInterval(refresh, every);
  }

  function statusOf(el) {
    const s = el.querySelector("[data-field=status]");
    return s ? s.textContent.trim() : null;
  }

  // `data-field="log"`: appended to as the instance writes, while it runs.
  function followLog(el) {
    const src = el.getAttribute("data-log-src");
    let offset = parseInt(el.getAttribute("data-offset"), 10) || 0;
    let follow = el.getAttribute("data-follow") === "true";
    const decoder = new TextDecoder("utf-8");
    async function read() {
      try {
        const r = await fetch(src + "?offset=" + offset, { credentials: "same-origin", cache: "no-store" });
        if (!r.ok) return false;
        const next = parseInt(r.headers.get("X-Log-Next-Offset"), 10);
        const bytes = new Uint8Array(await r.arrayBuffer());
        if (bytes.length > 0) {
          const atEnd = el.scrollTop + el.clientHeight >= el.scrollHeight - 8;
          el.append(document.createTextNode(decoder.decode(bytes, { stream: true })));
          if (atEnd) el.scrollTop = el.scrollHeight;
        }
        if (!isNaN(next)) offset = next;
        el.setAttribute("data-offset", String(offset));
        return bytes.length > 0;
      } catch (e) {
        return false;
      }
    }
    async function loop() {
      // Read what is there at once, then poll while the instance may still write.
      while (await read()) { /* more at once */ }
      if (follow) setTimeout(loop, 1000);
    }
    document.addEventListener("gpurent:status", function (e) {
      const s = e.detail.status;
      const was = follow;
      follow = s === "pending" || s === "starting" || s === "running" || s === "stopping";
      if (!follow && was) setTimeout(read, 1500); // its last words
      if (follow && !was) loop();
    });
    loop();
  }

  // `data-confirm` on a form: asked before it is sent.
  document.addEventListener("submit", function (e) {
    const form = e.target;
    const question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) e.preventDefault();
  });

  // The reserve form shows its price as it changes (only the fields that price it are sent).
  function quote(form) {
    const out = form.querySelector("[data-field=quote]");
    const src = form.getAttribute("data-quote");
    const fields = ["gpu_type", "gpu_count", "vram_gb", "vram_fraction", "hours", "tier", "bid"];
    let timer = null;
    async function ask() {
      const q = new URLSearchParams();
      fields.forEach(function (f) {
        const el = form.elements.namedItem(f);
        if (el && el.value) q.set(f, el.value);
      });
      try {
        const r = await fetch(src + "?" + q.toString(), { credentials: "same-origin", cache: "no-store" });
        if (r.ok) out.textContent = await r.text();
      } catch (e) { /* keep the last price */ }
    }
    form.addEventListener("input", function (e) {
      if (fields.indexOf(e.target.name) < 0) return;
      clearTimeout(timer);
      timer = setTimeout(ask, 200);
    });
  }

  // `data-copy="TEXT"` buttons copy their text (tokens shown once, commands).
  document.addEventListener("click", function (e) {
    const b = e.target.closest && e.target.closest("[data-copy]");
    if (!b || !navigator.clipboard) return;
    navigator.clipboard.writeText(b.getAttribute("data-copy")).then(function () {
      b.setAttribute("data-copied", "true");
    }, function () { /* not allowed here: the text is on the page */ });
  });

  document.addEventListener("DOMContentLoaded", function () {
    localTimes(document);
    live();
    document.querySelectorAll("pre[data-field=log][data-log-src]").forEach(followLog);
    document.querySelectorAll("form[data-quote]").forEach(quote);
  });
})();
