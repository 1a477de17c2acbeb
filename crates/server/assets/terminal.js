// The instance page's web terminal: xterm.js in [data-field="terminal"], over the WebSocket
// its data-socket names (/instances/ID/terminal). Keystrokes go as binary messages, a window
// change as {"type":"resize","cols":C,"rows":R}; the server sends the shell's output as
// binary and, last, {"type":"exit",...} or {"type":"error","message":...}.
// Needs vendor/xterm.js and vendor/addon-fit.js loaded before it (globals Terminal, FitAddon).
(function () {
  "use strict";

  function start(el) {
    var path = el.getAttribute("data-socket");
    if (!path || typeof Terminal !== "function" || typeof FitAddon === "undefined") {
      return;
    }
    var words = {
      ended: el.getAttribute("data-text-ended") || "The session ended.",
      exited: el.getAttribute("data-text-exited") || "The shell exited with status",
      signal: el.getAttribute("data-text-signal") || "The shell was ended by signal",
      lost: el.getAttribute("data-text-lost") || "The connection was lost.",
      refused: el.getAttribute("data-text-refused") ||
        "The terminal could not connect: the instance runs no more, or is not yours.",
      reconnect: el.getAttribute("data-text-reconnect") || "Reconnect",
    };

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

    function ended(line) {
      term.write("\r\n\x1b[2m" + line + "\x1b[0m\r\n");
      status.textContent = line;
      again.hidden = false;
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
          ended(words.exited + " " + msg.code + ".");
        } else if (msg.type === "exit") {
          ended(words.signal + " " + msg.signal + ".");
        } else if (msg.type === "error") {
          ended(msg.message || words.ended);
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
    for (var i = 0; i < els.length; i++) {
      start(els[i]);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
