// servesim dashboard: Prometheus text-format (0.0.4) parser, histogram
// quantile estimate and the per-sample derivations the page plots.
// Pure functions, no DOM: loaded by index.html as a classic script
// (window.ServesimMetrics) and by the node unit test (module.exports).
(function (root, factory) {
  const api = factory();
  if (typeof module === 'object' && module.exports) module.exports = api;
  else root.ServesimMetrics = api;
})(typeof self !== 'undefined' ? self : this, function () {
  'use strict';

  function parseValue(text) {
    switch (text) {
      case '+Inf': case 'Inf': case '+inf': case 'inf': return Infinity;
      case '-Inf': case '-inf': return -Infinity;
    }
    if (/^nan$/i.test(text)) return NaN;
    const v = Number(text);
    if (text === '' || Number.isNaN(v)) throw new Error(`bad sample value "${text}"`);
    return v;
  }

  // Parses `{a="x",b="y\"z"}` starting at line[i] === '{'. Returns [labels, next index].
  function parseLabels(line, i, lineNo) {
    const labels = {};
    i++; // '{'
    for (;;) {
      while (line[i] === ' ' || line[i] === '\t') i++;
      if (line[i] === '}') return [labels, i + 1];
      const m = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(i));
      if (!m) throw new Error(`line ${lineNo}: bad label name`);
      const name = m[0];
      i += name.length;
      while (line[i] === ' ') i++;
      if (line[i] !== '=') throw new Error(`line ${lineNo}: expected '=' after label ${name}`);
      i++;
      while (line[i] === ' ') i++;
      if (line[i] !== '"') throw new Error(`line ${lineNo}: expected '"' for label ${name}`);
      i++;
      let value = '';
      for (;;) {
        if (i >= line.length) throw new Error(`line ${lineNo}: unterminated label value`);
        const c = line[i++];
        if (c === '"') break;
        if (c === '\\') {
          const e = line[i++];
          value += e === 'n' ? '\n' : e; // \\ -> \, \" -> ", \n -> newline
        } else {
          value += c;
        }
      }
      labels[name] = value;
      while (line[i] === ' ') i++;
      if (line[i] === ',') { i++; continue; }
      if (line[i] === '}') return [labels, i + 1];
      throw new Error(`line ${lineNo}: expected ',' or '}' after label ${name}`);
    }
  }

  // Returns { types: {family: type}, help: {family: text},
  //           samples: [{name, labels, value}] }. Throws on malformed input.
  function parse(text) {
    const types = {};
    const help = {};
    const samples = [];
    const lines = text.split('\n');
    for (let n = 0; n < lines.length; n++) {
      const line = lines[n].replace(/\r$/, '');
      if (line.trim() === '') continue;
      if (line[0] === '#') {
        const m = /^#\s+(HELP|TYPE)\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(.*)$/.exec(line);
        if (m && m[1] === 'TYPE') types[m[2]] = m[3].trim();
        else if (m) help[m[2]] = m[3];
        continue; // other comments are ignored
      }
      const m = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line);
      if (!m) throw new Error(`line ${n + 1}: bad metric name`);
      const name = m[0];
      let i = name.length;
      let labels = {};
      if (line[i] === '{') [labels, i] = parseLabels(line, i, n + 1);
      const rest = line.slice(i).trim().split(/\s+/);
      if (rest.length < 1 || rest.length > 2 || rest[0] === '') {
        throw new Error(`line ${n + 1}: expected "value [timestamp]" after ${name}`);
      }
      samples.push({ name, labels, value: parseValue(rest[0]) });
    }
    return { types, help, samples };
  }

  // Prometheus' histogram_quantile (promql/quantile.go, bucketQuantile):
  // buckets are cumulative [{le, count}], the last one +Inf; linear
  // interpolation inside the bucket holding the rank, lower bound 0 for the
  // first bucket, the highest finite bound when the rank is in +Inf's.
  function histogramQuantile(q, buckets) {
    if (Number.isNaN(q)) return NaN;
    if (q < 0) return -Infinity;
    if (q > 1) return Infinity;
    const b = buckets.slice().sort((x, y) => x.le - y.le);
    if (b.length < 2 || b[b.length - 1].le !== Infinity) return NaN;
    // Float sums can make cumulative counts dip; Prometheus forces monotony.
    for (let i = 1; i < b.length; i++) {
      if (b[i].count < b[i - 1].count) b[i] = { le: b[i].le, count: b[i - 1].count };
    }
    const total = b[b.length - 1].count;
    if (!(total > 0)) return NaN;
    let rank = q * total;
    let k = b.findIndex((x) => x.count >= rank);
    if (k === b.length - 1) return b[b.length - 2].le;
    if (k === 0 && b[0].le <= 0) return b[0].le;
    let start = 0;
    let count = b[k].count;
    if (k > 0) {
      start = b[k - 1].le;
      count -= b[k - 1].count;
      rank -= b[k - 1].count;
    }
    if (count === 0) return start;
    return start + (b[k].le - start) * (rank / count);
  }

  const HISTOGRAMS = { ttft: 'servesim_ttft_seconds', tbt: 'servesim_tbt_seconds', e2e: 'servesim_e2e_seconds' };

  function addTo(map, key, v) { map[key] = (map[key] || 0) + v; }

  // One scrape, reduced to what the page shows: totals, per-replica gauges,
  // per-device busy time, histograms summed over replicas (per le).
  function summarize(parsed) {
    const s = {
      simulated: NaN, rtf: NaN, trace: NaN, done: false, scenario: '', version: '',
      arrived: 0, finished: 0, tokens: 0, preempted: 0, rejected: 0, iterations: 0, energy: 0,
      rejectedByReason: {},
      replicas: {},     // "0" -> {arrived, finished, tokens, queue, batch, kvUsed, kvTotal}
      devices: {},      // "0/xpu" -> {replica, device, kind, busy, energy}
      hist: {},         // ttft|tbt|e2e -> {buckets: [{le, count}], sum, count}
      seen: {},         // metric names present
    };
    const replica = (r) => {
      if (!(r in s.replicas)) {
        s.replicas[r] = { arrived: 0, finished: 0, tokens: 0, queue: NaN, batch: NaN, kvUsed: NaN, kvTotal: NaN };
      }
      return s.replicas[r];
    };
    const device = (l) => {
      const key = `${l.replica}/${l.device}`;
      if (!(key in s.devices)) s.devices[key] = { replica: l.replica, device: l.device, kind: l.kind, busy: 0, energy: 0 };
      return s.devices[key];
    };
    const buckets = {};
    for (const k of Object.keys(HISTOGRAMS)) { buckets[k] = {}; s.hist[k] = { buckets: [], sum: 0, count: 0 }; }

    for (const { name, labels, value } of parsed.samples) {
      s.seen[name] = true;
      const r = labels.replica;
      switch (name) {
        case 'servesim_simulated_seconds': s.simulated = value; break;
        case 'servesim_realtime_factor': s.rtf = value; break;
        case 'servesim_trace_seconds': s.trace = value; break;
        case 'servesim_run_done': s.done = value >= 1; break;
        case 'servesim_run_info': s.scenario = labels.scenario || ''; s.version = labels.version || ''; break;
        case 'servesim_requests_arrived_total': s.arrived += value; replica(r).arrived += value; break;
        case 'servesim_requests_finished_total': s.finished += value; replica(r).finished += value; break;
        case 'servesim_tokens_generated_total': s.tokens += value; replica(r).tokens += value; break;
        case 'servesim_requests_preempted_total': s.preempted += value; break;
        case 'servesim_iterations_total': s.iterations += value; break;
        case 'servesim_requests_rejected_total':
          s.rejected += value; addTo(s.rejectedByReason, labels.reason, value); break;
        case 'servesim_queue_length': replica(r).queue = value; break;
        case 'servesim_batch_size': replica(r).batch = value; break;
        case 'servesim_kv_blocks_used': replica(r).kvUsed = value; break;
        case 'servesim_kv_blocks_total': replica(r).kvTotal = value; break;
        case 'servesim_device_busy_seconds_total': device(labels).busy += value; break;
        case 'servesim_energy_joules_total': s.energy += value; device(labels).energy += value; break;
        default:
          for (const [k, base] of Object.entries(HISTOGRAMS)) {
            if (name === base + '_bucket') addTo(buckets[k], labels.le, value);
            else if (name === base + '_sum') s.hist[k].sum += value;
            else if (name === base + '_count') s.hist[k].count += value;
          }
      }
    }
    for (const k of Object.keys(HISTOGRAMS)) {
      s.hist[k].buckets = Object.entries(buckets[k])
        .map(([le, count]) => ({ le: parseValue(le), count }))
        .sort((a, b) => a.le - b.le);
    }
    return s;
  }

  // Counter increase between two scrapes (a drop means a reset: count from 0).
  function increase(prev, cur) { return cur >= prev ? cur - prev : cur; }

  function bucketDelta(prev, cur) {
    const before = new Map(prev.map((b) => [b.le, b.count]));
    return cur.map((b) => ({ le: b.le, count: increase(before.get(b.le) || 0, b.count) }));
  }

  const QUANTILES = [0.5, 0.9, 0.99];

  // Rates between two summaries, per simulated second. null when simulated
  // time did not advance (nothing to plot). Latency quantiles are estimated
  // from the bucket increases in the interval (histogram_quantile over the
  // interval's increase); NaN when nothing was observed in it.
  function derive(prev, cur) {
    const dt = cur.simulated - prev.simulated;
    if (!(dt > 0)) return null;
    const d = {
      t: cur.simulated,
      dt,
      tokensPerS: increase(prev.tokens, cur.tokens) / dt,
      finishedPerS: increase(prev.finished, cur.finished) / dt,
      arrivedPerS: increase(prev.arrived, cur.arrived) / dt,
      util: {},
      latency: {},
    };
    for (const [key, dev] of Object.entries(cur.devices)) {
      const before = prev.devices[key] ? prev.devices[key].busy : 0;
      d.util[key] = increase(before, dev.busy) / dt;
    }
    for (const k of Object.keys(HISTOGRAMS)) {
      const delta = bucketDelta(prev.hist[k].buckets, cur.hist[k].buckets);
      d.latency[k] = QUANTILES.map((q) => histogramQuantile(q, delta));
    }
    return d;
  }

  return { parse, parseValue, histogramQuantile, summarize, derive, increase, QUANTILES, HISTOGRAMS };
});
