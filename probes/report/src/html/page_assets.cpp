#include "html/page_assets.h"

namespace tpscope::report::html {

const std::string_view kStyle = R"CSS(
:root{color-scheme:light}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;
  background:#f4f5f7;color:#1f2328}
header{background:#1e1f24;color:#e1e1e6;padding:14px 28px}
header h1{margin:0;font-size:20px;font-weight:600}
header .meta{color:#a9abb3;font-size:13px;margin-top:2px}
header nav a{color:#8ab4f8;margin-right:14px;font-size:13px;text-decoration:none}
header .headline{margin:8px 0 2px;font-size:15px}
main{max-width:1320px;margin:0 auto;padding:6px 20px 30px}
section{background:#fff;border:1px solid #dde0e6;border-radius:6px;padding:10px 18px 14px;margin:14px 0;
  overflow-x:auto}
h2{font-size:17px;margin:0 0 4px}
h3{font-size:14px;margin:12px 0 4px;font-weight:600}
.summary,.note{color:#555b66;margin:2px 0 10px}
.error,#js-errors{color:#b71c1c;white-space:pre-wrap}
.bad{color:#b71c1c}
ol.findings{list-style:none;padding:0;margin:0}
ul.chain{margin:4px 0 10px 0;padding-left:18px}
ul.chain li{margin:3px 0}
.finding{border-left:5px solid;padding:6px 10px;margin:6px 0;background:#fafbfc}
.badge{color:#fff;font-size:11px;font-weight:700;text-transform:uppercase;padding:1px 6px;border-radius:3px}
.sev-warning .badge{color:#3a2e00}
.kind{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;color:#555b66}
.msg{font-weight:500}
.where{font-size:12.5px;color:#444;margin-top:2px}
ul.details{margin:3px 0 0;padding-left:18px;font-size:12.5px;color:#333}
ul.facts{margin:2px 0 8px;padding-left:18px}
details summary{cursor:pointer;color:#555b66;font-size:12.5px}
svg.chart{display:block;max-width:100%;height:auto;font-size:12px}
svg text{fill:#1f2328}
svg text.value,svg text.axis,svg text.legend{fill:#555b66;font-size:11.5px}
svg text.value.bad{fill:#b71c1c}
svg text.cellmark{fill:#fff;font-size:9px;font-weight:700}
svg rect.seg:hover,svg rect.nonfinite:hover{opacity:.75}
table.matrix{border-collapse:collapse;font-size:13px;margin-bottom:6px}
.matrix th,.matrix td{border:1px solid #dde0e6;padding:3px 10px;text-align:right}
.matrix th{background:#f3f4f7;font-weight:600}
.matrix td:nth-child(n+5),.matrix th:nth-child(n+5){text-align:left}
tr.missing td{color:#fff;font-weight:600}
.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin:0 4px 0 10px}
.legend{font-size:12px;color:#555b66;margin-top:6px}
.tl-toolbar{margin:4px 0 6px}
.tl-toolbar button{font:inherit;min-width:30px;margin-right:4px;padding:1px 8px;border:1px solid #c9ccd3;
  border-radius:4px;background:#f7f8fa;cursor:pointer}
#tl-range{color:#555b66;font-size:12.5px;margin-left:8px}
#tl-wrap{position:relative;border:1px solid #dde0e6}
svg.timeline{display:block;width:100%;cursor:grab;user-select:none;-webkit-user-select:none;font-size:11px}
svg.timeline.dragging{cursor:grabbing}
svg.timeline rect.lane{fill:#ffffff}
svg.timeline rect.lane.alt{fill:#f3f4f7}
svg.timeline text.lane-label{fill:#1f2328;font-size:11.5px}
svg.timeline .ruler text,svg.timeline text.mark{fill:#555b66;font-size:11px}
svg.timeline .ruler line{stroke:#c9ccd3}
svg.timeline line.step{stroke:#5a606e;stroke-dasharray:3 3}
svg.timeline text.stuck{fill:#b71c1c;font-weight:600}
svg.timeline rect.critical{fill:#1f2328;fill-opacity:.12;stroke:#1f2328;stroke-width:1.5}
svg.timeline rect.critical.transfer{stroke-dasharray:3 2}
svg.timeline line.critical{stroke:#1f2328;stroke-width:1.5}
.swatch.critical{background:#1f23281f;border:1.5px solid #1f2328;box-sizing:border-box}
#tl-tip{position:absolute;pointer-events:none;background:#1e1f24;color:#fff;font-size:12px;padding:4px 8px;
  border-radius:4px;white-space:pre;max-width:520px;overflow:hidden;z-index:2}
footer{color:#777;font-size:12px;text-align:center;padding:6px 0 18px}
)CSS";

const std::string_view kScript = R"JS(
(function () {
  'use strict';
  var body = document.body;
  function fail(message) {
    var box = document.getElementById('js-errors');
    if (box) { box.hidden = false; box.textContent += message + '\n'; }
    body.setAttribute('data-report-state', 'error');
  }
  window.addEventListener('error', function (e) { fail(String(e.message || e)); });

  var dataEl = document.getElementById('tl-data');
  var svg = document.getElementById('tl-svg');
  if (!dataEl || !svg) { body.setAttribute('data-report-state', 'ready'); return; }
  var d = JSON.parse(dataEl.textContent);
  var NS = svg.namespaceURI;
  var LABEL = 150, RULER = 34, ROW = 11, GAP = 6, FIELDS = 5;
  var maxLevel = d.levels - 1;
  var minSpan = 40 / (d.ticks * Math.pow(2, maxLevel));
  var v0 = 0, v1 = 1, width = 0, plotW = 0, level = 0, scheduled = false;
  var tip = document.getElementById('tl-tip');
  var rangeText = document.getElementById('tl-range');

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    parent.appendChild(e);
    return e;
  }
  function clear(g) { while (g.firstChild) g.removeChild(g.firstChild); }
  function label(parent, x, y, text, cls, anchor) {
    var t = el('text', {x: x, y: y, 'class': cls || '', 'text-anchor': anchor || 'start'}, parent);
    t.textContent = text;
    return t;
  }

  var laneY = [], y = RULER + 4;
  d.lanes.forEach(function (lane) { laneY.push(y); y += lane.rows * ROW + GAP; });
  var height = y + 2;
  svg.style.height = height + 'px';
  var gLanes = el('g', {}, svg), gRects = el('g', {}, svg), gMarks = el('g', {}, svg);
  var gRuler = el('g', {'class': 'ruler'}, svg), gLabels = el('g', {}, svg);
  var paths = d.colours.map(function (c) { return el('path', {fill: c}, gRects); });
  var laneBg = d.lanes.map(function (lane, i) {
    return el('rect', {x: 0, y: laneY[i] - GAP / 2, height: lane.rows * ROW + GAP, 'class': i % 2 ? 'lane alt' : 'lane'},
              gLanes);
  });
  d.lanes.forEach(function (lane, i) {  // long names are cut to the label column; the whole name is the hover title
    var text = lane.label.length > 24 ? lane.label.slice(0, 23) + '\u2026' : lane.label;
    el('title', {}, label(gLabels, 6, laneY[i] + 9, text, 'lane-label')).textContent = lane.label;
  });

  function chooseLevel() {
    var need = plotW / (2 * d.ticks * (v1 - v0));  // one tick at most 2 px
    return Math.max(0, Math.min(maxLevel, Math.ceil(Math.log(Math.max(need, 1)) / Math.LN2)));
  }
  function xOf(ns) { return LABEL + ((ns / d.ns) - v0) / (v1 - v0) * plotW; }
  function niceStep(x) {
    var p = Math.pow(10, Math.floor(Math.log(x) / Math.LN10));
    return x / p >= 5 ? 5 * p : x / p >= 2 ? 2 * p : p;
  }
  function drawRuler() {
    clear(gRuler);
    var from = v0 * d.ns, to = v1 * d.ns, step = niceStep((to - from) / 8);
    var decimals = Math.max(0, Math.min(6, Math.ceil(-Math.log(step / 1e6) / Math.LN10)));
    for (var t = Math.ceil((d.t0 + from) / step) * step; t <= d.t0 + to; t += step) {
      var x = xOf(t - d.t0);
      el('line', {x1: x, x2: x, y1: 4, y2: height}, gRuler);
      label(gRuler, x + 3, 14, (t / 1e6).toFixed(decimals) + ' ms');
    }
  }
  function drawMarks() {
    clear(gMarks);
    d.steps.forEach(function (s) {
      var x = xOf(s[1]);
      if (x < LABEL || x > width) return;
      el('line', {x1: x, x2: x, y1: 18, y2: height, 'class': 'step'}, gMarks);
      label(gMarks, x + 3, 28, 'step ' + s[0], 'mark');
    });
    var prev = null;  // the critical path: each stretch outlined on its lane, joined to the one before
    d.critical.forEach(function (c) {
      var lane = d.lanes[c[0]], x0 = xOf(c[1]), x1 = xOf(c[1] + c[2]), top = laneY[c[0]] - 1;
      var h = lane.rows * ROW + 1, cut0 = Math.max(LABEL, x0), cut1 = Math.min(width, x1);
      if (prev && Math.max(prev.x, x0) >= LABEL && Math.min(prev.x, x0) <= width && prev.lane !== c[0])
        el('line', {x1: prev.x, x2: x0, y1: prev.y, y2: top + h / 2, 'class': 'critical'}, gMarks);
      prev = {x: x1, y: top + h / 2, lane: c[0]};
      if (cut1 < LABEL || cut0 > width) return;
      var r = el('rect', {x: cut0, y: top, width: Math.max(2, cut1 - cut0), height: h,
                          'class': c[3] ? 'critical transfer' : 'critical'}, gMarks);
      el('title', {}, r).textContent = c[4];
    });
    svg.setAttribute('data-critical', d.critical.length);
    d.stuck.forEach(function (m) {
      var lane = d.lanes[m[0]], x = Math.max(LABEL, xOf(m[1]));
      if (x > width) return;
      el('rect', {x: x, y: laneY[m[0]], width: Math.max(2, width - x), height: lane.rows * ROW - 1, fill: '#dc1e1e',
                  'fill-opacity': 0.3}, gMarks);
      label(gMarks, x + 4, laneY[m[0]] + 9, m[2], 'stuck');
    });
  }
  function render() {
    scheduled = false;
    width = svg.clientWidth || (svg.parentNode && svg.parentNode.clientWidth) || 1200;
    plotW = Math.max(100, width - LABEL);
    level = chooseLevel();
    var ticks = d.ticks * Math.pow(2, level), scale = plotW / ((v1 - v0) * ticks), off = v0 * ticks;
    var parts = d.colours.map(function () { return []; }), drawn = 0;
    d.lanes.forEach(function (lane, i) {
      laneBg[i].setAttribute('width', width);
      var a = lane.l[level] || [];
      for (var j = 0; j < a.length; j += FIELDS) {
        var x0 = (a[j] - off) * scale, x1 = (a[j] + a[j + 1] - off) * scale;
        if (x1 < 0 || x0 > plotW) continue;
        x0 = Math.max(0, x0);
        x1 = Math.min(plotW, x1);
        var w = Math.max(x1 - x0, 0.8), top = laneY[i] + a[j + 2] * ROW;
        parts[a[j + 3]].push('M' + (LABEL + x0).toFixed(1) + ' ' + top + 'h' + w.toFixed(1) + 'v' + (ROW - 1) +
                             'h' + (-w).toFixed(1) + 'z');
        drawn++;
      }
    });
    paths.forEach(function (p, c) { p.setAttribute('d', parts[c].join('')); });
    drawRuler();
    drawMarks();
    rangeText.textContent = ((d.t0 + v0 * d.ns) / 1e6).toFixed(3) + ' – ' + ((d.t0 + v1 * d.ns) / 1e6).toFixed(3) +
                            ' ms · zoom ' + (1 / (v1 - v0)).toFixed(1) + '× · level ' + level;
    svg.setAttribute('data-rects', drawn);
    svg.setAttribute('data-level', level);
    body.setAttribute('data-timeline-rects', drawn);
  }
  function schedule() {
    if (!scheduled) { scheduled = true; window.requestAnimationFrame(render); }
  }
  function setView(a, b) {
    var span = Math.min(1, Math.max(minSpan, b - a));
    a = Math.max(0, Math.min(1 - span, a));
    v0 = a;
    v1 = a + span;
    schedule();
  }
  function zoom(factor, at) {
    var span = v1 - v0, c = v0 + span * at, next = Math.min(1, Math.max(minSpan, span * factor));
    setView(c - next * at, c - next * at + next);
  }
  function plotFraction(clientX) {
    var r = svg.getBoundingClientRect();
    return Math.max(0, Math.min(1, (clientX - r.left - LABEL) / plotW));
  }
  svg.addEventListener('wheel', function (e) {
    e.preventDefault();
    zoom(e.deltaY > 0 ? 1.25 : 0.8, plotFraction(e.clientX));
  }, {passive: false});
  var drag = null;
  svg.addEventListener('mousedown', function (e) {
    drag = {x: e.clientX, v0: v0};
    svg.classList.add('dragging');
    e.preventDefault();
  });
  window.addEventListener('mouseup', function () { drag = null; svg.classList.remove('dragging'); });
  window.addEventListener('mousemove', function (e) {
    if (!drag) return;
    var span = v1 - v0;
    setView(drag.v0 - (e.clientX - drag.x) / plotW * span, drag.v0 - (e.clientX - drag.x) / plotW * span + span);
  });
  svg.addEventListener('dblclick', function () { setView(0, 1); });
  document.querySelectorAll('[data-tl]').forEach(function (b) {
    b.addEventListener('click', function () {
      var what = b.getAttribute('data-tl');
      if (what === 'reset') setView(0, 1); else zoom(what === 'in' ? 0.5 : 2, 0.5);
    });
  });
  window.addEventListener('resize', schedule);

  function hit(e) {
    var r = svg.getBoundingClientRect(), px = e.clientX - r.left - LABEL, py = e.clientY - r.top;
    if (px < 0) return null;
    for (var i = 0; i < d.lanes.length; i++) {
      var row = Math.floor((py - laneY[i]) / ROW);
      if (row < 0 || row >= d.lanes[i].rows) continue;
      var ticks = d.ticks * Math.pow(2, level), t = v0 * ticks + px / plotW * (v1 - v0) * ticks;
      var a = d.lanes[i].l[level] || [], slack = 2 * (v1 - v0) * ticks / plotW;
      for (var j = 0; j < a.length; j += FIELDS)
        if (a[j + 2] === row && t >= a[j] - slack && t <= a[j] + a[j + 1] + slack)
          return {lane: d.lanes[i], x: a[j], w: a[j + 1], n: a[j + 4], ticks: ticks};
    }
    return null;
  }
  svg.addEventListener('mousemove', function (e) {
    if (drag) return;
    var h = hit(e);
    if (!h) { tip.hidden = true; return; }
    var ms = (h.w / h.ticks * d.ns / 1e6).toFixed(3);
    var what = h.n >= 0 ? d.names[h.n] : (h.n < -1 ? (-h.n) + ' spans merged' : '1 span');
    tip.textContent = what + '\n' + h.lane.label + ' · ' + (h.n < -1 ? 'block ' : '') + '≈ ' + ms + ' ms';
    var r = svg.parentNode.getBoundingClientRect();
    tip.style.left = Math.min(e.clientX - r.left + 12, r.width - 260) + 'px';
    tip.style.top = (e.clientY - r.top + 14) + 'px';
    tip.hidden = false;
  });
  svg.addEventListener('mouseleave', function () { tip.hidden = true; });

  render();
  body.setAttribute('data-report-state', 'ready');
})();
)JS";

}  // namespace tpscope::report::html
