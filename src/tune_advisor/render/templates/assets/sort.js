// Sort a table by the clicked column: numbers by their data-sort value, text otherwise; blanks sort last.
"use strict";
document.querySelectorAll("table.sortable").forEach(function (table) {
  var headers = table.querySelectorAll("thead th");
  headers.forEach(function (th, column) {
    var button = th.querySelector("button");
    if (!button) return;
    button.addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      headers.forEach(function (other) { other.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var key = function (row) {
        var cell = row.cells[column];
        var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent.trim();
        var number = parseFloat(raw);
        return { blank: raw === "", number: isNaN(number) || !cell.hasAttribute("data-sort") ? null : number,
                 text: raw.toLowerCase() };
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x.blank !== y.blank) return x.blank ? 1 : -1;
        var order = x.number !== null && y.number !== null ? x.number - y.number
                  : x.text < y.text ? -1 : x.text > y.text ? 1 : 0;
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
