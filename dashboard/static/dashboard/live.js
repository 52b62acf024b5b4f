/* The console's live updates, with no framework and no build step.
 *
 * A page opens one websocket (its path is the badge's data-live-socket). The
 * server pushes small messages: {kind, subject, data}. The page never builds
 * HTML from them; it asks the server again for the parts they concern, the
 * elements marked data-live-fragment="<url>", and swaps the answer in. So a
 * patched page and a reloaded page are the same page.
 *
 * Which parts a message concerns:
 *   data-live-nodes="*"          every message;
 *   data-live-nodes="a b c"      messages naming node a, b or c;
 *   data-live-structure          messages that change which parts exist (a node
 *                                registered, a card moved to a domain this page
 *                                does not draw, a rack went dark or came back);
 *   data-live-every="10"         also every 10 s while live (for what nothing
 *                                publishes yet).
 * After a reconnect every part is fetched again: messages sent while the socket
 * was down are lost, the database is not.
 *
 * In a storm the socket holds messages back for a quarter second and sends
 * them in one frame (dashboard/consumers.py): a "batch" lists them, each read
 * as if it had come alone, and each part is fetched once for all of them; a
 * "resync" says too many came to list, and every part is fetched again.
 */
(function () {
  "use strict";

  var badge = document.getElementById("live-badge");
  if (!badge) return;
  var socketPath = badge.getAttribute("data-live-socket");
  var loadedAt = new Date();
  var lastFresh = loadedAt;
  var everOpen = false;
  var retryS = 1;
  var timers = [];
  var inflight = {}; // url -> {busy, again}

  function say(state, words) {
    badge.setAttribute("data-live-state", state);
    var w = badge.querySelector(".words");
    if (w) w.textContent = words;
  }

  function staleWords(prefix) {
    return prefix + " (showing the state at " + lastFresh.toLocaleTimeString() + ")";
  }

  function parts() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-live-fragment]"));
  }

  function nodesOf(el) {
    var v = el.getAttribute("data-live-nodes");
    return v ? v.split(/\s+/).filter(Boolean) : [];
  }

  // The nodes a message is about: the subject of node messages, the lists of a reachability sweep.
  function named(msg) {
    var out = [];
    var data = msg.data || {};
    if (String(msg.kind || "").indexOf("node.") === 0 && msg.subject) out.push(String(msg.subject));
    ["unreachable", "lost"].forEach(function (k) {
      if (Array.isArray(data[k])) out = out.concat(data[k].map(String));
    });
    return out;
  }

  function structural(msg, names) {
    var data = msg.data || {};
    if (msg.kind === "node.registered") return true;
    if ((data.domains_dark || []).length || (data.domains_back || []).length) return true;
    var moves = data.domain_moves || [];
    if (!moves.length) return false;
    var drawn = {};
    document.querySelectorAll("[data-domain-key]").forEach(function (el) {
      drawn[el.getAttribute("data-domain-key")] = true;
    });
    var listed = {};
    parts().forEach(function (el) {
      nodesOf(el).forEach(function (n) { listed[n] = true; });
    });
    var elsewhere = moves.some(function (m) {
      return (m[1] && !drawn[m[1]]) || (m[2] && !drawn[m[2]]);
    });
    return elsewhere || names.some(function (n) { return !listed[n]; });
  }

  function concerned(msg) {
    var names = named(msg);
    var isStructural = null;
    var wanted = parts().filter(function (el) {
      var nodes = nodesOf(el);
      if (nodes.indexOf("*") >= 0) return true;
      if (names.some(function (n) { return nodes.indexOf(n) >= 0; })) return true;
      if (!el.hasAttribute("data-live-structure")) return false;
      if (isStructural === null) isStructural = structural(msg, names);
      return isStructural;
    });
    // A part re-rendered whole brings its inner parts with it: fetch only the outermost.
    return wanted.filter(function (el) {
      return !wanted.some(function (other) { return other !== el && other.contains(el); });
    });
  }

  function outermost() {
    var all = parts();
    return all.filter(function (el) {
      return !all.some(function (other) { return other !== el && other.contains(el); });
    });
  }

  // Fetch one part again and swap it in; a fetch already running for it is followed by one more.
  function refresh(url) {
    var slot = inflight[url] || (inflight[url] = { busy: false, again: false });
    if (slot.busy) {
      slot.again = true;
      return;
    }
    slot.busy = true;
    fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) {
        // The admin sends a lapsed session to its login page: that is not a fragment.
        if (r.redirected || r.status === 401 || r.status === 403) throw new Error("logged out");
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        var tpl = document.createElement("template");
        tpl.innerHTML = html.trim();
        var fresh = tpl.content.firstElementChild;
        parts().forEach(function (el) {
          if (fresh && el.getAttribute("data-live-fragment") === url) el.replaceWith(fresh);
        });
        lastFresh = new Date();
      })
      .catch(function (err) {
        if (err.message === "logged out") say("refused", "not live: the session has ended; reload the page to log in");
      })
      .then(function () {
        slot.busy = false;
        if (slot.again) {
          slot.again = false;
          refresh(url);
        }
      });
  }

  function startTimers() {
    parts().forEach(function (el) {
      var every = parseFloat(el.getAttribute("data-live-every"));
      if (every > 0) {
        var url = el.getAttribute("data-live-fragment");
        timers.push(setInterval(function () { refresh(url); }, every * 1000));
      }
    });
  }

  function stopTimers() {
    timers.forEach(clearInterval);
    timers = [];
  }

  function connect() {
    if (!socketPath || !("WebSocket" in window)) return;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + location.host + socketPath);
    say(everOpen ? "lost" : "connecting", everOpen ? staleWords("not live: reconnecting…") : "connecting…");
    ws.onopen = function () {
      var missed = everOpen || new Date() - loadedAt > 1000;
      everOpen = true;
      retryS = 1;
      say("live", "live");
      if (missed) outermost().forEach(function (el) { refresh(el.getAttribute("data-live-fragment")); });
      startTimers();
    };
    ws.onmessage = function (ev) {
      var msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      var wanted = [];
      if (msg.kind === "resync") {
        wanted = outermost();
      } else {
        var each = msg.kind === "batch" && msg.data && Array.isArray(msg.data.updates) ? msg.data.updates : [msg];
        each.forEach(function (one) {
          concerned(one).forEach(function (el) { if (wanted.indexOf(el) < 0) wanted.push(el); });
        });
      }
      // Each part once for the whole frame, and only the outermost of those that nest.
      wanted
        .filter(function (el) { return !wanted.some(function (o) { return o !== el && o.contains(el); }); })
        .forEach(function (el) { refresh(el.getAttribute("data-live-fragment")); });
    };
    ws.onclose = function (ev) {
      stopTimers();
      if (ev.code === 4403) {
        say("refused", "not live: only a logged-in operator may listen; reload the page to log in");
        return;
      }
      if (ev.code === 4404) {
        say("refused", "not live: what this page shows no longer exists");
        return;
      }
      say("lost", staleWords("not live: reconnecting…"));
      setTimeout(connect, retryS * 1000);
      retryS = Math.min(30, retryS * 2);
    };
  }

  connect();
})();
