// The appliance console's one script: the Overview's charts, refreshed every 5 s from
// /api/history, and a group's lag chart, refreshed every 5 s from /api/groups/<group>/lag
// (uPlot, vendored beside this file). Every other page is plain HTML forms.
(function () {
  "use strict";
  if (typeof uPlot === "undefined") return;
  var colours = ["#2458c5", "#c5522a", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4", "#cf222e"];

  function every5s(url, got) {
    function refresh() {
      fetch(url, {credentials: "same-origin"}).then(function (r) {
        if (!r.ok) throw new Error(r.status);
        return r.json();
      }).then(got).catch(function () { /* the next refresh tries again */ });
    }
    refresh();
    setInterval(refresh, 5000);
  }

  // The time axis. uPlot widens a time scale with a single x value to a day in the scale's
  // unit, and ours is seconds read as milliseconds (uPlot's ms: 1e-3): 86,400,000 s, so a
  // chart with one point had an axis of years. A lone point gets the hour around it (the hour
  // the charts keep); two points or more span what they cover; none, uPlot's own empty range.
  var HALF_HOUR_S = 1800;
  function timeRange(u, min, max) {
    var xs = u.data && u.data[0];
    if (xs && xs.length === 1 && xs[0] != null) return [xs[0] - HALF_HOUR_S, xs[0] + HALF_HOUR_S];
    return [min, max];
  }

  function options(labels) {
    var series = [{}];
    labels.forEach(function (label, i) {
      series.push({label: label, stroke: colours[i % colours.length], width: i ? 1 : 1.5,
                   spanGaps: false});
    });
    return {width: 440, height: 200, series: series, axes: [{}, {size: 60}],
            scales: {x: {time: true, range: timeRange}},
            // the x scale's span in seconds on the chart's element, for the browser tests
            hooks: {setScale: [function (u, key) {
              if (key === "x" && u.scales.x.min != null)
                u.root.parentNode.dataset.xspan = String(u.scales.x.max - u.scales.x.min);
            }]}};
  }

  // -- the Overview --------------------------------------------------------------------------
  var charts = document.querySelectorAll(".chart[data-series]");
  if (charts.length) {
    var plots = [];
    var columns = function (keys, data) {
      var out = [data.t || []];
      keys.forEach(function (k) { out.push(data[k] || []); });
      return out;
    };
    every5s("/api/history", function (data) {
      if (!plots.length) {
        charts.forEach(function (el) {
          var keys = el.dataset.series.split(",");
          var labels = el.dataset.label.split(",");
          plots.push({keys: keys, plot: new uPlot(options(keys.map(function (k, i) {
            return labels[i] || k; })), columns(keys, data), el)});
        });
      } else {
        plots.forEach(function (p) { p.plot.setData(columns(p.keys, data)); });
      }
      charts.forEach(function (el) { el.dataset.points = String((data.t || []).length); });
      document.body.dataset.chartsLoaded = String((data.t || []).length);
    });
  }

  // -- a group's lag -------------------------------------------------------------------------
  var lagEl = document.querySelector(".chart[data-lag]");
  if (lagEl) {
    var lagPlot = null, shown = "";
    every5s(lagEl.dataset.lag, function (data) {
      var cols = [data.t, data.total].concat(data.lag);
      var names = data.partitions.join(",");
      if (lagPlot && names === shown) {
        lagPlot.setData(cols);
      } else {               // a partition came or went: a new chart with its series
        if (lagPlot) lagPlot.destroy();
        lagPlot = new uPlot(options(["total"].concat(data.partitions)), cols, lagEl);
        shown = names;
      }
      lagEl.dataset.points = String(data.t.length);
    });
  }
})();
