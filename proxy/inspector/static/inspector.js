// The inspector works without this file: it adds the sessions filter and "unfold all".
"use strict";
(function () {
  var filter = document.getElementById("filter");
  if (filter) {
    var rows = document.querySelectorAll("tr[data-search]");
    var apply = function () {
      var words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
      rows.forEach(function (row) {
        var text = row.getAttribute("data-search") || "";
        row.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
      });
    };
    filter.addEventListener("input", apply);
    filter.form.addEventListener("submit", function (event) { event.preventDefault(); });
    var asked = new URLSearchParams(window.location.search).get("q");
    if (asked) { filter.value = asked; }
    apply();
  }
  document.querySelectorAll("button.unfold-all").forEach(function (button) {
    var request = button.closest("details.request");
    button.hidden = false;
    button.addEventListener("click", function () {
      var folded = request.querySelectorAll("details.long:not([open]), details.unchanged:not([open])");
      var unfold = folded.length > 0;
      request.querySelectorAll("details.long, details.unchanged").forEach(function (d) {
        d.open = unfold;
      });
      button.textContent = unfold ? "fold all" : "unfold all";
    });
  });
})();
