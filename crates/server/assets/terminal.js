// The instance page's web terminal: xterm.js in [data-field="terminal"], over the WebSocket
// its data-socket names (/instances/ID/terminal). Keystrokes go as binary messages, a window
// change as {"type":"resize","cols":C,"rows":R}; the server sends the shell's output as
// binary and, last, {"type":"exit","code":N} (or "signal") or {"type":"error","code":C,
// "message":M}: the status line says C in the page's words (data-C-text, C with dashes),
// the terminal shows the server's own message M.
// Words come from the element's data-*-text attributes (the page's language). While
// data-running is not "true" it waits for console.js's gpurent:status event saying running.
// Loaded before xterm.js and addon-fit.js (all deferred), it starts once the document is
// parsed, when their globals Terminal and FitAddon are there.
// The page's CSP has no 'unsafe-inline': styles come from stylesheets, from `<style>` elements
// carrying the nonce of this script's own tag (new with every response), and from the CSSOM.
// xterm.js makes `<style>` elements (its theme, the cell size): each gets the nonce as it is
// created, before xterm.js fills and inserts it. It colours 24-bit cells with
// setAttribute("style", ...), which the CSP refuses: that goes through the CSSOM instead.
(function () {
  "use strict";

  var nonce = document.currentScript ? document.currentScript.nonce : "";
  if (nonce) {
    var createElement = Document.prototype.createElement;
    Document.prototype.createElement = function (name) {
      var el = createElement.apply(this, arguments);
      if (String(name).toLowerCase() === "style") {
        el.nonce = nonce;
      }
      return el;
    };
  }
  var setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() === "style" && this.style) {
      this.style.cssText = String(value);
      return;
    }
    return setAttribute.apply(this, arguments);
  };

  function start(el) {
    var path = el.getAttribute("data-socket");
    if (!path || typeof Terminal !== "function" || typeof FitAddon === "undefined") {
      return;
    }
    function word(name, fallback) {
      return el.getAttribute("data-" + name + "-text") || fallback;
    }
    var words = {
      ended: word("ended", "The session ended."),
      exited: word("exited", "The shell exited with status {}."),
      signal: word("signal", "The shell was ended by signal {}."),
      lost: word("lost", "The connection was lost."),
      refused: word("refused",
        "The terminal could not connect: the instance runs no more, or is not yours."),
      reconnect: word("reconnect", "Reconnect"),
    };
    // The page's own placeholder ("opens once the instance is running") gives way.
    while (el.firstChild) {
      el.removeChild(el.firstChild);
    }

    // The screen fills the element above its status line; the fit addon measures the screen.
    el.style.display = "flex";
    el.style.flexDirection = "column";
    if (el.clientHeight < 120) {
      el.style.height = "26rem";
    }
    var screen = document.createElement("div");
    screen.className = "terminal-screen";
    screen.style.flex = "1 1 auto";
    screen.style.minHeight = "0";
    screen.style.overflow = "hidden";
    el.appendChild(screen);
    var bar = document.createElement("div");
    bar.className = "terminal-bar";
    var status = document.createElement("span");
    status.setAttribute("data-field", "terminal-status");
    status.setAttribute("role", "status");
    var again = document.createElement("button");
    again.type = "button";
    again.setAttribute("data-action", "reconnect");
    again.textContent = words.reconnect;
    again.hidden = true;
    bar.appendChild(status);
    bar.appendChild(again);
    el.appendChild(bar);

    var term = new Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000 });
    var fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(screen);
    var encoder = new TextEncoder();
    var socket = null;

    function fitNow() {
      try {
        fit.fit();
      } catch (e) {
        // Hidden (display: none) terminals have no size to fit; the next resize fits.
      }
    }

    function sendSize() {
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
      }
    }

    // `final`: reconnecting cannot help (the instance runs no more); the control stays hidden.
    function ended(line, detail, final) {
      term.write("\r\n\x1b[2m" + (detail || line) + "\x1b[0m\r\n");
      status.textContent = line;
      again.hidden = !!final;
    }

    function connect() {
      again.hidden = true;
      status.textContent = "";
      fitNow();
      var scheme = location.protocol === "https:" ? "wss:" : "ws:";
      var url = scheme + "//" + location.host + path +
        (path.indexOf("?") < 0 ? "?" : "&") + "cols=" + term.cols + "&rows=" + term.rows;
      var ws = new WebSocket(url);
      ws.binaryType = "arraybuffer";
      var said = false;
      var opened = false;
      ws.onopen = function () {
        opened = true;
        sendSize();
        term.focus();
      };
      ws.onmessage = function (ev) {
        if (typeof ev.data !== "string") {
          term.write(new Uint8Array(ev.data));
          return;
        }
        var msg;
        try {
          msg = JSON.parse(ev.data);
        } catch (e) {
          return;
        }
        said = true;
        if (msg.type === "exit" && typeof msg.code === "number") {
          ended(words.exited.replace("{}", String(msg.code)));
        } else if (msg.type === "exit") {
          ended(words.signal.replace("{}", String(msg.signal)));
        } else if (msg.type === "error") {
          var code = String(msg.code || "").replace(/_/g, "-");
          ended(code ? word(code, msg.message || words.ended) : words.ended, msg.message,
            code === "not-running" || code === "not-found");
        }
      };
      // A refused upgrade or a dropped connection fires error then close: close says it.
      ws.onerror = function () {};
      ws.onclose = function () {
        if (socket === ws) {
          socket = null;
        }
        if (!said) {
          ended(opened ? words.lost : words.refused);
        }
      };
      socket = ws;
    }

    term.onData(function (data) {
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(encoder.encode(data));
      }
    });
    term.onBinary(function (data) {
      if (socket && socket.readyState === WebSocket.OPEN) {
        var bytes = new Uint8Array(data.length);
        for (var i = 0; i < data.length; i++) {
          bytes[i] = data.charCodeAt(i) & 255;
        }
        socket.send(bytes);
      }
    });
    term.onResize(sendSize);
    var pending = 0;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(fitNow, 100);
    });
    again.addEventListener("click", connect);
    connect();
  }

  function init() {
    var els = document.querySelectorAll('[data-field="terminal"][data-socket]');
    Array.prototype.forEach.call(els, function (el) {
      if (el.getAttribute("data-running") !== "false") {
        start(el);
        return;
      }
      document.addEventListener("gpurent:status", function waiting(e) {
        if (e.detail && e.detail.status === "running") {
          document.removeEventListener("gpurent:status", waiting);
          el.setAttribute("data-running", "true");
          start(el);
        }
      });
    });
  }

  // Deferred scripts run before DOMContentLoaded, in order: xterm.js and addon-fit.js too.
  if (document.readyState === "loading" || typeof Terminal !== "function") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
