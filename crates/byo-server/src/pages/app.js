// The pages' few live parts. Every page is complete without this file: it only adds a copy
// button, a countdown to a one-liner's expiry and live preparation progress, each on the
// elements that ask for it with a data- attribute. No inline handlers, nothing fetched from
// elsewhere.
"use strict";

(function () {
  // Copy: <button data-copy="ID" hidden> copies the text of #ID. Shown only when it can work.
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () {
        return legacyCopy(text);
      });
    }
    return legacyCopy(text);
  }

  function legacyCopy(text) {
    return new Promise(function (resolve, reject) {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.style.position = "fixed";
      area.style.opacity = "0";
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try {
        ok = document.execCommand("copy");
      } catch (e) {
        ok = false;
      }
      document.body.removeChild(area);
      if (ok) {
        resolve();
      } else {
        reject(new Error("copy refused"));
      }
    });
  }

  function setUpCopy(button) {
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) {
      return;
    }
    var label = button.textContent;
    var timer = null;
    button.hidden = false;
    button.addEventListener("click", function () {
      copyText(source.textContent.trim()).then(
        function () {
          button.textContent = "Copied";
        },
        function () {
          // Leave the command selected so the owner can copy it by hand.
          var range = document.createRange();
          range.selectNodeContents(source);
          var selection = window.getSelection();
          selection.removeAllRanges();
          selection.addRange(range);
          button.textContent = "Selected: press Ctrl+C";
        }
      );
      clearTimeout(timer);
      timer = setTimeout(function () {
        button.textContent = label;
      }, 2000);
    });
  }

  // Countdown: <time datetime="EXPIRY" data-now="SERVER NOW" data-countdown="ID"> writes
  // "expires in mm:ss" into #ID, measured on the server's clock (the difference between the
  // two instants the server wrote), so a wrong clock in the browser does not matter. With
  // data-used-when="SELECTOR" it stops once the page holds what the selector names (the
  // host's polled progress saying it enrolled): a used one-liner does not count down.
  function two(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function setUpCountdown(time) {
    var out = document.getElementById(time.getAttribute("data-countdown"));
    var expires = Date.parse(time.getAttribute("datetime"));
    var serverNow = Date.parse(time.getAttribute("data-now"));
    if (!out || isNaN(expires) || isNaN(serverNow)) {
      return;
    }
    var left0 = expires - serverNow;
    var started = Date.now();
    var timer = null;
    var usedWhen = time.getAttribute("data-used-when");
    var finished = false;
    function done(text, scopeClass) {
      finished = true;
      out.textContent = text;
      var scope = time.closest("[data-expires-scope]");
      if (scope) {
        scope.classList.add(scopeClass);
        scope.querySelectorAll("button[data-copy]").forEach(function (b) {
          b.disabled = true;
        });
      }
      clearInterval(timer);
    }
    function tick() {
      if (usedWhen && document.querySelector(usedWhen)) {
        done("used: your machine enrolled — its progress is below", "used");
        return;
      }
      var left = Math.max(0, Math.ceil((left0 - (Date.now() - started)) / 1000));
      if (left <= 0) {
        out.classList.add("error");
        done("expired — add the GPU again", "expired");
        return;
      }
      out.textContent =
        "expires in " + two(Math.floor(left / 60)) + ":" + two(left % 60);
    }
    tick();
    if (!finished) {
      timer = setInterval(tick, 250);
    }
  }

  // Progress: <div data-progress="URL"> is replaced by the server's fragment at URL every
  // two seconds, until the fragment says it is settled (data-settled="true").
  var POLL_MS = 2000;

  function settled(box) {
    return box.querySelector('[data-settled="true"]') !== null;
  }

  function setUpProgress(box) {
    var url = box.getAttribute("data-progress");
    var busy = false;
    var timer = null;
    function poll() {
      if (busy || document.hidden) {
        return;
      }
      busy = true;
      fetch(url, {
        credentials: "same-origin",
        headers: { Accept: "text/html" },
        cache: "no-store",
      })
        .then(function (r) {
          // A lapsed session answers with the sign-in page: keep what is shown.
          if (!r.ok || r.redirected) {
            return null;
          }
          return r.text();
        })
        .then(function (html) {
          if (html !== null && html !== box.innerHTML) {
            box.innerHTML = html;
          }
          if (settled(box)) {
            clearInterval(timer);
          }
        })
        .catch(function () {})
        .then(function () {
          busy = false;
        });
    }
    if (!settled(box)) {
      timer = setInterval(poll, POLL_MS);
    }
  }

  // Relative times (issue #42, 2): a plain <time datetime> reads "3 min ago" (or "in 5 min"),
  // its exact time kept as the hover title and readable without the script; refreshed every
  // 30 s. Countdowns and named times (an id) keep their own text.
  function relative(ms) {
    var s = Math.round(ms / 1000), a = Math.abs(s), text;
    if (a < 45) text = a + " s";
    else if (a < 3600) text = Math.round(a / 60) + " min";
    else if (a < 86400) text = Math.round(a / 3600) + " h";
    else text = Math.round(a / 86400) + " d";
    return s >= 0 ? text + " ago" : "in " + text;
  }

  function setUpRelative(time) {
    if (time.id || time.hasAttribute("data-countdown")) return;
    var when = Date.parse(time.getAttribute("datetime"));
    if (isNaN(when)) return;
    if (!time.title) time.title = time.textContent.trim();
    var render = function () { time.textContent = relative(Date.now() - when); };
    render();
    setInterval(render, 30000);
  }

  // A table wider than its window scrolls in its own box (div.scroll); while it does, the
  // box takes keyboard focus so arrow keys can scroll it too (issue #42, 3).
  function focusScrolling() {
    document.querySelectorAll("div.scroll").forEach(function (box) {
      if (box.scrollWidth > box.clientWidth) {
        box.setAttribute("tabindex", "0");
      } else {
        box.removeAttribute("tabindex");
      }
    });
  }

  function start() {
    focusScrolling();
    window.addEventListener("resize", focusScrolling);
    document.querySelectorAll("time[datetime]").forEach(setUpRelative);
    document.querySelectorAll("button[data-copy]").forEach(setUpCopy);
    document.querySelectorAll("time[data-countdown]").forEach(setUpCountdown);
    document.querySelectorAll("[data-progress]").forEach(setUpProgress);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
