/* goodtrace HTML report: draws the embedded data with Apache ECharts.
 * Run text (names, tags, hosts) only ever reaches the DOM through textContent or esc(). */
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('goodtrace-data').textContent);
  var charts = {};
  var pending = 0;  // charts created and not yet drawn ('finished' can fire inside setOption)
  var allCreated = false;
  window.goodtraceCharts = charts;
  window.goodtraceTimings = {start: performance.now()};
  window.goodtraceReady = false;

  function esc(value) {
    return String(value).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function seconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return '-';
    var a = Math.abs(s);
    if (a >= 3600) return (s / 3600).toFixed(2) + ' h';
    if (a >= 60) return (s / 60).toFixed(1) + ' min';
    if (a >= 1) return s.toFixed(3) + ' s';
    if (a >= 1e-3) return (s * 1e3).toFixed(2) + ' ms';
    return (s * 1e6).toFixed(1) + ' \u00b5s';
  }
  function ms(v) { return seconds(v / 1e3); }
  function pct(f) { return (f === null || f === undefined) ? '-' : (f * 100).toFixed(1) + '%'; }

  var FIXED = {
    productive: '#3ba272', compute: '#5470c6', data: '#91cc75', init: '#9a60b4', compile: '#fc8452',
    checkpoint_save: '#ee6666', checkpoint_restore: '#ea7ccc', eval: '#fac858', gc: '#73c0de',
    profile: '#b6a2de', log: '#c4ccd3', startup: '#9a60b4', scheduling: '#d0d5dd', warmup: '#f3a683',
    wasted_progress: '#c23531', disruption: '#61a0a8', teardown: '#a5a5a5', in_progress: '#8fb7d9',
    device: '#2f4554'
  };
  var EXTRA = ['#d48265', '#749f83', '#ca8622', '#bda29a', '#6e7074', '#546570', '#c4ccd3', '#4b565b'];
  function colorOf(name) {
    if (Object.prototype.hasOwnProperty.call(FIXED, name)) return FIXED[name];
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return EXTRA[h % EXTRA.length];
  }

  function chart(id, option) {
    var node = document.getElementById(id);
    var instance = echarts.init(node, null, {renderer: 'canvas'});
    charts[id] = instance;
    pending += 1;
    var done = false;
    instance.on('finished', function () {
      if (done) return;
      done = true;
      window.goodtraceTimings[id] = performance.now() - window.goodtraceTimings.start;
      pending -= 1;
      if (pending === 0 && allCreated) window.goodtraceReady = true;
    });
    instance.setOption(option);
    window.addEventListener('resize', function () { instance.resize(); });
    return instance;
  }

  // ---------------------------------------------------------------- headline
  var summary = data.summary;
  document.title = 'goodtrace: ' + summary.run;
  document.getElementById('title').textContent = 'goodtrace report: ' + summary.run;
  document.getElementById('subtitle').textContent =
    summary.ranks + ' rank(s) on ' + summary.hosts + ' host(s), ' + summary.attempts + ' attempt(s)';
  var headline = document.getElementById('headline');
  function figure(label, value) {
    var box = el('div', null, 'figure');
    box.appendChild(el('b', value));
    box.appendChild(el('span', label, 'muted'));
    headline.appendChild(box);
  }
  if (summary.analysed) {
    figure('goodput', pct(summary.goodput));
    figure('job time', seconds(summary.total_s));
    figure('ideal step', seconds(summary.ideal_step_s));
    if (summary.mfu !== undefined) figure('MFU', pct(summary.mfu));
  } else {
    figure('goodput', 'not analysed');
  }
  if (summary.verdict) {
    var verdict = document.getElementById('verdict');
    verdict.appendChild(el('b', summary.verdict.text));
    verdict.appendChild(document.createTextNode('; ' + summary.verdict.evidence));
  }
  var notes = document.getElementById('notes');
  function note(text) { notes.appendChild(el('li', text)); }
  if (summary.time_range) {
    var range = summary.time_range;
    note('Time range ' + range.start + ' to ' + range.end + ' (UTC, --since/--until): goodput ' + pct(range.goodput) +
         '; the step chart and goodput over time keep to it, the rest is the whole job.');
  }
  if (summary.host_overhead) note('Host overhead: ' + summary.host_overhead);
  (summary.attempts_detail || []).forEach(function (a) {
    note('Attempt ' + a.index + ': steps ' + (a.first_step === null ? '-' : a.first_step + '-' + a.last_step) +
         ', ' + seconds(a.duration_s) + ', ' + a.ended);
  });
  (summary.rewinds || []).forEach(function (r) { note('Attempt ' + r.attempt + ': ' + r.text); });
  (summary.stragglers || []).forEach(function (s) { note('Slow rank ' + s.rank + ' (' + s.host + '): ' + s.reason); });
  var events = summary.events || [];
  if (events.length) {
    note('Events (' + summary.events_total + (summary.events_total > events.length ? ', first ' + events.length : '') + '):');
    var list = el('ul');
    events.forEach(function (e) {
      var attrs = e.attrs ? ' ' + Object.keys(e.attrs).slice(0, 4).map(function (k) {
        return k + '=' + JSON.stringify(e.attrs[k]);
      }).join(', ') : '';
      list.appendChild(el('li', '+' + seconds(e.time_s) + ' rank ' + e.rank + ' (attempt ' + e.attempt + ', step ' +
                              (e.step === null ? '-' : e.step) + '): ' + e.name + attrs));
    });
    notes.lastChild.appendChild(list);
  }
  (summary.warnings || []).forEach(function (w) { note('Warning: ' + w); });
  (summary.problems || []).forEach(function (w) { note('Reading: ' + w); });

  // ---------------------------------------------------------------- buckets
  var buckets = data.buckets.slice().sort(function (a, b) { return b[1] - a[1]; });
  var table = document.getElementById('bucket-table');
  buckets.forEach(function (b) {
    var tr = el('tr');
    tr.appendChild(el('td', b[0]));
    tr.appendChild(el('td', seconds(b[1]), 'num'));
    tr.appendChild(el('td', pct(b[2]), 'num'));
    table.appendChild(tr);
  });
  if (!buckets.length) document.getElementById('buckets').style.height = '60px';
  chart('buckets', {
    animation: false,
    title: buckets.length ? undefined : {text: 'no analysis given: buckets unavailable', left: 'center', top: 'middle',
                                          textStyle: {fontSize: 13, color: '#687083'}},
    grid: {left: 140, right: 80, top: 10, bottom: 30},
    tooltip: {trigger: 'item', formatter: function (p) {
      var b = buckets[p.dataIndex];
      return esc(b[0]) + ': ' + esc(seconds(b[1])) + ' (' + esc(pct(b[2])) + ')';
    }},
    xAxis: {type: 'value', name: 's'},
    yAxis: {type: 'category', inverse: true, data: buckets.map(function (b) { return b[0]; })},
    series: [{type: 'bar', data: buckets.map(function (b) {
      return {value: b[1], itemStyle: {color: colorOf(b[0])}};
    }), label: {show: true, position: 'right', formatter: function (p) { return pct(buckets[p.dataIndex][2]); }}}]
  });

  // ---------------------------------------------------------------- goodput over time
  var over = data.over_time;
  var overNote = document.getElementById('over-time-note');
  if (!over) {
    overNote.textContent = 'No goodput over time: the job has no time to cut into periods.';
    document.getElementById('over-time').style.display = 'none';
  } else {
    var periodLabel = function (k) {
      var s = over.start[k], e = over.end[k];
      var day = s.slice(5, 10), from = s.slice(11, 19), to = e.slice(11, 19);
      from = from.slice(6) === '00' ? from.slice(0, 5) : from;
      to = to.slice(6) === '00' ? to.slice(0, 5) : to;
      return day + ' ' + from + '-' + to;
    };
    var overLabels = over.start.map(function (_, k) { return periodLabel(k); });
    var worstRank = {};
    over.worst.forEach(function (k, r) { worstRank[k] = r + 1; });
    var overNames = Object.keys(over.series);
    overNote.textContent = over.start.length + ' period(s) of ' + seconds(over.every_s) +
      ' on the UTC clock (the first and last may be partial). Bars stack each bucket\u2019s share of the period; ' +
      'triangles mark the periods that lost the most time.';
    var overSeries = overNames.map(function (name) {
      return {name: name, type: 'bar', stack: 'share', barCategoryGap: '15%', large: over.start.length > 2000,
              itemStyle: {color: colorOf(name)},
              data: over.series[name].map(function (v) { return +(v * 100).toFixed(4); })};
    });
    overSeries.push({name: 'worst', type: 'scatter', symbol: 'triangle', symbolSize: 12, z: 6,
                     itemStyle: {color: '#c23531'},
                     data: over.worst.map(function (k) { return [overLabels[k], 102]; })});
    chart('over-time', {
      animation: false,
      legend: {type: 'scroll', top: 0},
      grid: {left: 60, right: 30, top: 36, bottom: 70},
      tooltip: {trigger: 'axis', axisPointer: {type: 'shadow'}, formatter: function (params) {
        var k = overLabels.indexOf(params[0].axisValue);
        var lines = ['<b>' + esc(over.start[k]) + ' \u2013 ' + esc(over.end[k]) + '</b>' +
                     (over.partial[k] ? ' (partial)' : ''),
                     'goodput ' + esc(pct(over.goodput[k])) + ', lost ' + esc(seconds(over.lost_s[k])) +
                     (worstRank[k] ? ' (worst #' + worstRank[k] + ')' : '')];
        overNames.forEach(function (name) {
          var v = over.series[name][k];
          if (v > 0) lines.push(esc(name) + ': ' + esc(pct(v)));
        });
        return lines.join('<br>');
      }},
      xAxis: {type: 'category', data: overLabels, name: 'UTC'},
      yAxis: {type: 'value', name: '% of period', min: 0, max: 105,
              axisLabel: {formatter: function (v) { return v <= 100 ? v + '%' : ''; }}},
      dataZoom: [{type: 'inside'}, {type: 'slider', bottom: 10}],
      series: overSeries
    });
  }

  // ---------------------------------------------------------------- step time
  var steps = data.steps;
  var n = steps.steps.length;
  var xs = [];
  for (var i = 0; i < n; i++) xs.push(String(i));
  var binned = steps.bin > 1;
  var executions = binned ? steps.counts.reduce(function (a, b) { return a + b; }, 0) : n;
  document.getElementById('steps-note').textContent = n ?
    executions + ' step execution(s), from the ' + steps.source + '. ' +
    (binned ? 'Each bar is up to ' + steps.bin + ' consecutive executions of one attempt: it stacks their mean ' +
              'productive time and each mean overhead. ' : 'Bars stack productive time and each overhead; ') +
    'shaded bands are attempts; pins mark tags, triangles anomalies. Drag or scroll to zoom.' :
    'No step executions: ' + steps.why_empty + '.';
  var totals = [];
  for (i = 0; i < n; i++) {
    var t = 0;
    for (var key in steps.series) t += steps.series[key][i];
    totals.push(t);
  }
  var names = Object.keys(steps.series);
  var stepSeries = names.map(function (name, k) {
    var s = {name: name, type: 'bar', stack: 'time', large: n > 2000, barCategoryGap: '10%',
             itemStyle: {color: colorOf(name)}, data: steps.series[name].map(function (v) { return +v.toFixed(6); })};
    if (k === 0) {
      s.markArea = {silent: true, itemStyle: {color: 'rgba(84,112,198,0.06)', borderColor: 'rgba(84,112,198,0.4)',
                                              borderWidth: 1},
                    label: {position: 'insideTopLeft', color: '#687083'},
                    data: steps.bands.map(function (b, j) {
                      return [{xAxis: String(b[0]), name: b[2],
                               itemStyle: {color: j % 2 ? 'rgba(250,200,88,0.08)' : 'rgba(84,112,198,0.06)'}},
                              {xAxis: String(b[1])}];
                    })};
    }
    return s;
  });
  var tagged = [];
  for (i = 0; i < n; i++) if (steps.tags[i].length) tagged.push([String(i), totals[i]]);
  stepSeries.push({name: 'tags', type: 'scatter', symbol: 'pin', symbolSize: 18, itemStyle: {color: '#fac858'},
                   z: 5, data: tagged});
  stepSeries.push({name: 'anomalies', type: 'scatter', symbol: 'triangle', symbolSize: 12, z: 6,
                   itemStyle: {color: '#c23531'},
                   data: steps.anomalies.map(function (a) { return [String(a[0]), totals[a[0]]]; })});
  var anomalyAt = {};
  var anomalyCount = {};
  steps.anomalies.forEach(function (a) { anomalyAt[a[0]] = a; anomalyCount[a[0]] = (anomalyCount[a[0]] || 0) + 1; });
  chart('steps', {
    animation: false,
    legend: {type: 'scroll', top: 0},
    grid: {left: 70, right: 30, top: 36, bottom: 70},
    tooltip: {trigger: 'axis', axisPointer: {type: 'shadow'}, formatter: function (params) {
      var idx = +params[0].axisValue;
      var lines = binned ?
        ['<b>steps ' + esc(steps.steps[idx]) + '-' + esc(steps.last_steps[idx]) + '</b> (attempt ' +
         esc(steps.attempts[idx]) + ', ' + esc(steps.counts[idx]) + ' executions from execution ' + esc(steps.seq[idx]) + ')',
         'mean step time ' + esc(seconds(totals[idx])) + ', slowest ' + esc(seconds(steps.max_s[idx]))] :
        ['<b>step ' + esc(steps.steps[idx]) + '</b> (attempt ' + esc(steps.attempts[idx]) +
         ', execution ' + esc(steps.seq[idx]) + ')',
         'step time ' + esc(seconds(totals[idx]))];
      if (steps.shared[idx] > 1) lines.push('interval of ' + esc(steps.shared[idx]) + ' steps: an average, not per-step truth');
      names.forEach(function (name) {
        var v = steps.series[name][idx];
        if (v > 0) lines.push(esc(name) + ': ' + esc(seconds(v)));
      });
      if (steps.device && steps.device[idx] !== null) lines.push('device busy: ' + esc(seconds(steps.device[idx])));
      if (steps.tags[idx].length) lines.push('tags: ' + esc(steps.tags[idx].join(', ')));
      var a = anomalyAt[idx];
      if (a && binned) lines.push(esc(anomalyCount[idx]) + ' anomal' + (anomalyCount[idx] > 1 ? 'ies' : 'y') +
                                  ': productive time above ' + esc(seconds(a[2])));
      else if (a) lines.push('anomaly: productive time above ' + esc(seconds(a[2])) + (a[1].length ? '; overlapped: ' + esc(a[1].join(', ')) : ''));
      return lines.join('<br>');
    }},
    xAxis: {type: 'category', data: xs, name: 'step',
            axisLabel: {formatter: function (v) { return String(steps.steps[+v]); }}},
    yAxis: {type: 'value', name: 's'},
    dataZoom: [{type: 'inside'}, {type: 'slider', bottom: 10}],
    series: stepSeries
  });

  // ---------------------------------------------------------------- heat map
  var heat = data.heatmap;
  var heatChart = null;
  // Each cell is the rank's time relative to the median rank at that step (1.00 = median), so a
  // rank that is 5% slower at every step stands out even next to a long first (compiling) step.
  function median(values) {
    var v = values.slice().sort(function (a, b) { return a - b; });
    // the mean of the middle two for an even count: with two ranks the upper one alone would
    // make the slower rank the 1.00 reference and show only the faster one
    var h = Math.floor(v.length / 2);
    return v.length ? (v.length % 2 ? v[h] : (v[h - 1] + v[h]) / 2) : null;
  }
  function heatData(matrix) {
    var out = [];
    var lo = 1, hi = 1;
    var columns = matrix.length ? matrix[0].length : 0;
    for (var c = 0; c < columns; c++) {
      var column = [];
      for (var r = 0; r < matrix.length; r++) if (matrix[r][c] !== null) column.push(matrix[r][c]);
      var mid = median(column);
      for (r = 0; r < matrix.length; r++) {
        var v = matrix[r][c];
        if (v === null) continue;
        var ratio = mid > 0 ? v / mid : 1;
        out.push([c, r, +ratio.toFixed(4), v]);
        if (ratio < lo) lo = ratio;
        if (ratio > hi) hi = ratio;
      }
    }
    var spread = Math.min(Math.max(1 - lo, hi - 1, 0.02), 1);
    return {points: out, lo: 1 - spread, hi: 1 + spread};
  }
  var rankLabels = heat.ranks.map(function (r) { return 'rank ' + r; });
  function heatOption(which) {
    var matrix = which === 'compute' ? heat.compute_ms : heat.step_ms;
    var d = heatData(matrix);
    return {
      animation: false,
      grid: {left: 80, right: 135, top: 10, bottom: 75},
      tooltip: {trigger: 'item', formatter: function (p) {
        var c = p.value[0], r = p.value[1];
        return esc(rankLabels[r]) + ' (' + esc(heat.hosts[r]) + ')<br>step ' + esc(heat.columns[c]) +
               '<br>' + esc(which === 'compute' ? 'compute' : 'step time') + ': ' + esc(ms(p.value[3])) +
               (heat.bin > 1 ? ' (mean of ' + esc(heat.bin) + ' steps)' : '') +
               '<br>' + esc(p.value[2].toFixed(3)) + ' x the median rank';
      }},
      xAxis: {type: 'category', data: heat.columns, name: heat.columns.some(function (c) { return c.charAt(0) === 'a'; }) ? 'step (aK: = attempt K)' : 'step',
              nameLocation: 'middle', nameGap: 24,
              splitArea: {show: false}},
      yAxis: {type: 'category', data: rankLabels, inverse: true},
      // the colour scale at the right edge, its handle labels clear of the rank slider beside it
      visualMap: {min: d.lo, max: d.hi, dimension: 2, calculable: true, orient: 'vertical', right: 10, top: 'middle',
                  text: ['slower', 'faster'], inRange: {color: ['#2166ac', '#92c5de', '#f7f7f7', '#f4a582', '#b2182b']},
                  formatter: function (v) { return v.toFixed(2) + 'x'; }},
      // At most 128 ranks at a time (the slider scrolls through the rest), so every row is visible.
      dataZoom: [{type: 'slider', yAxisIndex: 0, right: 112, width: 14, startValue: 0,
                  endValue: Math.min(heat.ranks.length - 1, 127)},
                 {type: 'slider', xAxisIndex: 0, bottom: 8}],
      series: [{type: 'heatmap', data: d.points, progressive: 0}]
    };
  }
  var heatNote = heat.columns.length + ' step execution column(s)' + (heat.bin > 1 ? ' (each the mean of ' + heat.bin + ' steps)' : '') +
                 ' for ' + heat.ranks.length + ' rank(s), each cell relative to the median rank at that step: a slow rank is a red row.';
  document.getElementById('heat-note').textContent = heatNote;
  var computeButton = document.getElementById('heat-compute');
  var stepButton = document.getElementById('heat-step');
  if (!heat.compute_ms) { computeButton.disabled = true; computeButton.title = 'no compute spans recorded'; }
  var startWith = heat.compute_ms ? 'compute' : 'step';
  heatChart = chart('heatmap', heatOption(startWith));
  function showHeat(which) {
    heatChart.setOption(heatOption(which), true);
    stepButton.setAttribute('aria-pressed', String(which === 'step'));
    computeButton.setAttribute('aria-pressed', String(which === 'compute'));
  }
  showHeat(startWith);
  stepButton.addEventListener('click', function () { showHeat('step'); });
  computeButton.addEventListener('click', function () { showHeat('compute'); });
  document.getElementById('heatmap').style.height = Math.max(260, Math.min(900, Math.min(heat.ranks.length, 128) * 14 + 80)) + 'px';
  heatChart.resize();

  // ---------------------------------------------------------------- gantt
  var g = data.gantt;
  var ganttNote = document.getElementById('gantt-note');
  if (!g) {
    ganttNote.textContent = steps.why_empty ? 'No timeline to show: ' + steps.why_empty + '.' :
      'No timeline to show: no rank completed a step in the chosen range.';
    document.getElementById('gantt').style.display = 'none';
  } else {
    var legend = document.getElementById('gantt-legend');
    g.categories.forEach(function (c) {
      var item = el('span', null, 'legend-item');
      var swatch = el('span', null, 'swatch');
      swatch.style.background = colorOf(c);
      item.appendChild(swatch);
      item.appendChild(el('span', c));
      legend.appendChild(item);
    });
    ganttNote.textContent = 'Spans of every rank, steps ' + g.steps[0] + '-' + g.steps[1] + ' of attempt ' + g.attempt +
      ', on the aligned clock (ms from the range start). Tall bars: main thread (nested spans narrower); ' +
      'thin bars below: other threads and device time. Scroll to zoom, drag to pan, hover for details.' +
      (g.truncated ? ' Only the first ' + g.rows.length + ' ranks are shown (too many spans).' : '');
    var ganttNode = document.getElementById('gantt');
    ganttNode.style.height = Math.max(300, Math.min(1400, g.rows.length * 22 + 120)) + 'px';
    var catColors = g.categories.map(colorOf);
    var renderItem = function (params, api) {
      var row = api.value(0), depth = api.value(6), lane = api.value(7);
      var start = api.coord([api.value(1), row]);
      var end = api.coord([api.value(2), row]);
      var band = api.size([0, 1])[1];
      var top, height;
      if (lane === 0) {
        height = band * 0.62 * Math.pow(0.78, depth);
        top = start[1] - band * 0.42 + (band * 0.62 - height) / 2;
      } else {
        height = band * 0.18;
        top = start[1] + band * (lane === 1 ? 0.24 : 0.04) - (lane === 2 ? band * 0.46 : 0);
      }
      var rect = echarts.graphic.clipRectByRect(
        {x: start[0], y: top, width: Math.max(end[0] - start[0], 1), height: Math.max(height, 1)},
        {x: params.coordSys.x, y: params.coordSys.y, width: params.coordSys.width, height: params.coordSys.height});
      return rect && {type: 'rect', shape: rect, style: {fill: catColors[api.value(4)]}};
    };
    chart('gantt', {
      animation: false,
      grid: {left: 150, right: 40, top: 30, bottom: 75},
      tooltip: {trigger: 'item', confine: true, formatter: function (p) {
        var v = p.value;
        return '<b>' + esc(g.names[v[3]]) + '</b><br>category: ' + esc(g.categories[v[4]]) +
               '<br>duration: ' + esc(ms(v[2] - v[1])) + '<br>step: ' + esc(v[5] < 0 ? '-' : v[5]) +
               '<br>' + esc(g.rows[v[0]]) + (v[7] === 1 ? ' (other thread)' : v[7] === 2 ? ' (device)' : '');
      }},
      xAxis: {type: 'value', name: 'ms from the range start', nameLocation: 'middle', nameGap: 22,
              min: 'dataMin', max: 'dataMax', scale: true},
      yAxis: {type: 'category', data: g.rows, inverse: true, axisLabel: {fontSize: 11}},
      dataZoom: [{type: 'inside', xAxisIndex: 0, filterMode: 'weakFilter'},
                 {type: 'slider', xAxisIndex: 0, bottom: 8, filterMode: 'weakFilter'},
                 {type: 'slider', yAxisIndex: 0, right: 8, width: 14, filterMode: 'weakFilter',
                  endValue: Math.min(g.rows.length - 1, 63)}],
      // progressive: 0 draws every bar in one pass: incrementally drawn elements get no hover.
      series: [{type: 'custom', renderItem: renderItem, encode: {x: [1, 2], y: 0}, clip: true, progressive: 0,
                data: g.items,
                markLine: {silent: true, symbol: 'none', lineStyle: {color: '#aab', type: 'dashed'},
                           // the y axis is inverted, so 'start' is the top edge: clear of the ms labels below
                           label: {formatter: '{b}', fontSize: 10, position: 'start'},
                           data: g.marks.map(function (m) { return {xAxis: m[0], name: m[1]}; })}}]
    });
  }
  allCreated = true;
  if (pending === 0) window.goodtraceReady = true;
})();
