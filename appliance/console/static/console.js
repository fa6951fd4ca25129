// The appliance console's one script: the Overview's charts (uPlot, vendored beside this file),
// refreshed every 5 s from /api/history. Every other page is plain HTML forms.
(function () {
  "use strict";
  var charts = document.querySelectorAll(".chart[data-series]");
  if (!charts.length || typeof uPlot === "undefined") return;
  var colours = ["#2458c5", "#c5522a", "#1a7f37"];
  var plots = [];

  function build(el, data) {
    var keys = el.dataset.series.split(",");
    var labels = el.dataset.label.split(",");
    var series = [{}];
    keys.forEach(function (k, i) {
      series.push({label: labels[i] || k, stroke: colours[i % colours.length], width: 1.5,
                   spanGaps: false});
    });
    var opts = {width: 440, height: 200, series: series,
                axes: [{}, {size: 60}], scales: {x: {time: true}}};
    return {el: el, keys: keys, plot: new uPlot(opts, columns(keys, data), el)};
  }

  function columns(keys, data) {
    var out = [data.t || []];
    keys.forEach(function (k) { out.push(data[k] || []); });
    return out;
  }

  function refresh() {
    fetch("/api/history", {credentials: "same-origin"}).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r.json();
    }).then(function (data) {
      if (!plots.length) {
        charts.forEach(function (el) { plots.push(build(el, data)); });
      } else {
        plots.forEach(function (p) { p.plot.setData(columns(p.keys, data)); });
      }
      document.body.dataset.chartsLoaded = String((data.t || []).length);
    }).catch(function () { /* the next refresh tries again */ });
  }

  refresh();
  setInterval(refresh, 5000);
})();
