/* perfscope standalone report: figures and sortable, filterable tables (no external libraries).
   Data arrives as JSON in <script type="application/json"> blocks; every report string is put
   into the page with textContent, never as HTML. */
(function () {
  "use strict";
  function readJson(id) { return JSON.parse(document.getElementById(id).textContent); }

  function si(v, unit) {
    if (v === null || v === undefined || !isFinite(v)) return "n/a";
    var scales = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < scales.length; i++) {
      if (Math.abs(v) >= scales[i][0]) return (v / scales[i][0]).toPrecision(3) + " " + scales[i][1] + unit;
    }
    return Number(v).toPrecision(3) + " " + unit;
  }
  function dur(ns) {
    if (ns === null || ns === undefined || !isFinite(ns)) return "n/a";
    var units = [[1e9, "s"], [1e6, "ms"], [1e3, "\u00b5s"]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(ns) >= units[i][0]) return (ns / units[i][0]).toPrecision(3) + " " + units[i][1];
    }
    return Number(ns).toPrecision(3) + " ns";
  }
  var NAME_MAX = 160;
  // A long kernel name: elided in the middle past NAME_MAX characters (the whole name is the cell's
  // title, shown on hover), with break opportunities (zero-width spaces) after "::", "(", "<", ","
  // and "_" so that it wraps between its parts, never in the middle of a word (a run of 24 characters
  // without any of them gets one, so that no name sets the table wider than the page).
  function readableName(v) {
    var text = String(v);
    if (text.length > NAME_MAX) text = text.slice(0, 100) + " \u2026 " + text.slice(text.length - 50);
    text = text.replace(/(::|\(|<|,|_)/g, "$1\u200b");
    // a mangled or generated name has runs with none of those: one break opportunity every 24 characters
    return text.replace(/([^\s\u200b]{24})(?=[^\s\u200b])/g, "$1\u200b");
  }
  function fmt(kind, v) {
    if (v === null || v === undefined) return "n/a";
    switch (kind) {
      case "ns": return dur(v);
      case "s": return dur(v * 1e9);
      case "pct": return isFinite(v) ? Number(v).toFixed(2) + "%" : "n/a";
      case "si": return si(v, "");
      case "num": return isFinite(v) ? Number(v).toPrecision(4) : "n/a";
      case "int": return String(v);
      default: return String(v);
    }
  }

  function renderFigures() {
    var figs = document.querySelectorAll("div.fig[data-figure]");
    for (var i = 0; i < figs.length; i++) {
      var spec = readJson(figs[i].getAttribute("data-figure"));
      window.Plotly.newPlot(figs[i], spec.data, spec.layout, {responsive: true, displaylogo: false});
    }
  }

  function makeTable(holder) {
    var spec = readJson(holder.getAttribute("data-table"));
    var state = {rows: spec.rows.slice(), sortCol: -1, asc: false, filter: ""};
    var input = holder.querySelector("input");
    var counter = holder.querySelector(".count");
    var table = holder.querySelector("table");
    var thead = document.createElement("thead"), tbody = document.createElement("tbody");
    var tr = document.createElement("tr");
    spec.columns.forEach(function (col, idx) {
      var th = document.createElement("th");
      th.textContent = col.label;
      th.title = "sort by " + col.label;
      th.addEventListener("click", function () { sortBy(idx); });
      tr.appendChild(th);
    });
    thead.appendChild(tr); table.appendChild(thead); table.appendChild(tbody);

    function sortBy(idx) {
      state.asc = state.sortCol === idx ? !state.asc : spec.columns[idx].kind === "text";
      state.sortCol = idx;
      var dir = state.asc ? 1 : -1;
      state.rows.sort(function (a, b) {
        var x = a[idx], y = b[idx];
        if (x === null) return 1; if (y === null) return -1;
        return (x < y ? -1 : x > y ? 1 : 0) * dir;
      });
      var ths = thead.querySelectorAll("th");
      for (var i = 0; i < ths.length; i++) ths[i].className = i === idx ? (state.asc ? "asc" : "desc") : "";
      draw();
    }
    function draw() {
      var needle = state.filter.toLowerCase();
      var frag = document.createDocumentFragment(), shown = 0;
      state.rows.forEach(function (row) {
        if (needle && !row.some(function (v) { return v !== null && String(v).toLowerCase().indexOf(needle) >= 0; })) return;
        shown++;
        var r = document.createElement("tr");
        spec.columns.forEach(function (col, idx) {
          var td = document.createElement("td");
          var isName = col.kind === "text" && (col.key === "name" || col.key === "op" || col.key === "op_shapes")
            && row[idx] !== null;
          td.textContent = isName ? readableName(row[idx]) : fmt(col.kind, row[idx]);
          if (isName) td.title = String(row[idx]);
          td.className = col.kind === "text" ? (isName ? "name" : "") : "num";
          r.appendChild(td);
        });
        frag.appendChild(r);
      });
      tbody.textContent = "";
      tbody.appendChild(frag);
      counter.textContent = shown + " of " + spec.rows.length + " rows" + (spec.note ? " \u2014 " + spec.note : "");
    }
    input.addEventListener("input", function () { state.filter = input.value; draw(); });
    draw();
  }

  function init() {
    renderFigures();
    var tables = document.querySelectorAll("div.tableholder[data-table]");
    for (var i = 0; i < tables.length; i++) makeTable(tables[i]);
    document.body.setAttribute("data-ready", "1");
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
