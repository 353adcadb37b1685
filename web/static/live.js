// jobman serve: keep the page's live parts current without reloading, and confirm actions.
// Each element with data-part is fetched again as ?part=NAME every few seconds (same origin,
// the token travels in the page's cookie) and replaced when it changed.
(function () {
  "use strict";
  var INTERVAL = Number(document.documentElement.dataset.interval || 2000);
  var state = document.getElementById("live-state");
  var parts = Array.prototype.slice.call(document.querySelectorAll("[data-part]"));
  var busy = false;

  function ticked() {
    var boxes = document.querySelectorAll("input[name=curves]:checked");
    return Array.prototype.map.call(boxes, function (b) { return b.value; });
  }

  function refresh(el) {
    var url = new URL(window.location.href);
    url.searchParams.set("part", el.dataset.part);
    return fetch(url.toString(), { credentials: "same-origin" }).then(function (response) {
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      return response.text();
    }).then(function (html) {
      if (html === el.dataset.shown) { return; }
      var keep = ticked();
      el.innerHTML = html;
      el.dataset.shown = html;
      keep.forEach(function (id) {
        var box = el.querySelector("input[name=curves][value='" + id + "']");
        if (box) { box.checked = true; }
      });
    });
  }

  function tick() {
    if (busy || document.hidden || !parts.length) { return; }
    busy = true;
    Promise.all(parts.map(refresh)).then(function () {
      if (state) { state.textContent = "live · " + new Date().toLocaleTimeString(); }
    }).catch(function (error) {
      if (state) { state.textContent = "not updating: " + error.message; }
    }).then(function () { busy = false; });
  }

  // Right after the first paint, then every INTERVAL: the slow parts (a report of 100,000 jobs)
  // are left out of the page itself and arrive with the first update.
  if (parts.length) { tick(); window.setInterval(tick, INTERVAL); }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) { event.preventDefault(); }
  });
})();
