// servesim live dashboard: polls /metrics, plots over simulated time.
// Everything shown comes from the scrape; see metrics.js for the maths.
(function () {
  'use strict';
  const M = window.ServesimMetrics;
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(100, Number(params.get('interval')) || 500);
  const MAX_POINTS = 4000; // beyond this, every other point is dropped
  const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf', '#7f7f7f', '#bcbd22'];
  const QCOLORS = ['#2ca02c', '#ff7f0e', '#d62728'];

  const state = window.servesimDashboard = {
    samples: 0,       // points plotted (distinct simulated times)
    scrapes: 0,       // successful /metrics fetches
    status: 'connecting',
    last: null,       // summary of the latest scrape (metrics.js summarize())
    lastRates: null,  // derive() of the latest two plotted points
    error: null,
  };

  // ---------- formatting ----------
  const intFmt = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
  function fmtInt(v) { return Number.isFinite(v) ? intFmt.format(v) : '–'; }
  function fmtSimTime(s) {
    if (!Number.isFinite(s)) return '–';
    if (Math.abs(s) < 120) return `${+s.toFixed(1)}s`;
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
    const mm = String(m).padStart(2, '0'), ss = String(sec).padStart(2, '0');
    return h > 0 ? `${h}:${mm}:${ss}` : `${m}:${ss}`;
  }
  function fmtSeconds(v) {
    if (!Number.isFinite(v)) return '–';
    if (v < 1) return `${+(v * 1000).toPrecision(3)} ms`;
    return `${+v.toPrecision(4)} s`;
  }
  function fmtEnergy(j) {
    if (!Number.isFinite(j)) return '–';
    const units = [['GJ', 1e9], ['MJ', 1e6], ['kJ', 1e3]];
    for (const [u, f] of units) if (j >= f) return `${+(j / f).toPrecision(4)} ${u}`;
    return `${+j.toPrecision(4)} J`;
  }
  function setValue(id, raw, text) {
    const el = document.getElementById(id);
    el.dataset.value = String(raw);
    el.textContent = text;
  }

  // ---------- charts ----------
  const xs = [];
  const charts = [];
  const SIM_INCRS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400];

  class LiveChart {
    // spec: {id, title, axes: [{scale, label, fmt}], }
    constructor(spec) {
      this.spec = spec;
      this.series = new Map(); // key -> {label, scale, color, data[]}
      this.plot = null;
      this.builtKeys = '';
      const box = document.createElement('section');
      box.className = 'chart';
      box.id = `chart-${spec.id}`;
      box.innerHTML = `<h2></h2><div class="plot"><div class="empty">waiting for data</div></div>`;
      box.querySelector('h2').textContent = spec.title;
      document.getElementById('charts').appendChild(box);
      this.el = box.querySelector('.plot');
      new ResizeObserver(() => { if (this.plot) this.plot.setSize(this.size()); }).observe(this.el);
    }
    size() { return { width: Math.max(200, this.el.clientWidth), height: 200 }; }
    // values: key -> {label, value, scale?, color?}; call once per point
    add(values) {
      const n = xs.length; // xs already holds the new point
      for (const [key, v] of Object.entries(values)) {
        if (!this.series.has(key)) {
          this.series.set(key, {
            label: v.label, scale: v.scale || this.spec.axes[0].scale,
            color: v.color || PALETTE[this.series.size % PALETTE.length], dash: v.dash,
            data: new Array(n - 1).fill(null),
          });
        }
      }
      for (const [key, s] of this.series) {
        const v = values[key] ? values[key].value : null;
        s.data.push(Number.isFinite(v) ? v : null);
      }
    }
    decimate() {
      for (const s of this.series.values()) s.data = s.data.filter((_, i, a) => i % 2 === 1 || i === a.length - 1);
    }
    render() {
      const keys = [...this.series.keys()].join('|');
      const data = [xs, ...[...this.series.values()].map((s) => s.data)];
      if (this.plot && keys === this.builtKeys) { this.plot.setData(data); return; }
      if (this.plot) this.plot.destroy();
      this.el.textContent = '';
      this.builtKeys = keys;
      const scales = { x: { time: false } };
      for (const a of this.spec.axes) scales[a.scale] = { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.05 : 1] };
      const axes = [{ values: (u, splits) => splits.map(fmtSimTime), incrs: SIM_INCRS, label: 'simulated time' }];
      this.spec.axes.forEach((a, i) => axes.push({
        scale: a.scale, label: a.label, side: i === 0 ? 3 : 1, grid: { show: i === 0 },
        values: (u, splits) => splits.map((v) => (a.fmt ? a.fmt(v) : +v.toPrecision(4))), size: 60,
      }));
      const series = [{ label: 'simulated', value: (u, v) => fmtSimTime(v) }];
      for (const s of this.series.values()) {
        series.push({ label: s.label, scale: s.scale, stroke: s.color, dash: s.dash, width: 1.5, spanGaps: false, points: { show: false } });
      }
      this.plot = new uPlot({ ...this.size(), scales, axes, series, legend: { live: true }, cursor: { drag: { x: false, y: false } } }, data, this.el);
    }
  }

  const pct = (v) => `${+(v * 100).toPrecision(3)}%`;
  const C = {
    throughput: new LiveChart({ id: 'throughput', title: 'Throughput (per simulated second)',
      axes: [{ scale: 'tok', label: 'tokens/s' }, { scale: 'req', label: 'requests/s' }] }),
    ttft: new LiveChart({ id: 'ttft', title: 'TTFT percentiles (interval)', axes: [{ scale: 's', label: 'seconds', fmt: fmtSeconds }] }),
    tbt: new LiveChart({ id: 'tbt', title: 'TBT percentiles (interval)', axes: [{ scale: 's', label: 'seconds', fmt: fmtSeconds }] }),
    batch: new LiveChart({ id: 'batch', title: 'Running batch size per replica', axes: [{ scale: 'n', label: 'requests' }] }),
    queue: new LiveChart({ id: 'queue', title: 'Queue length per replica', axes: [{ scale: 'n', label: 'requests' }] }),
    kv: new LiveChart({ id: 'kv', title: 'KV blocks used / total per replica', axes: [{ scale: 'f', label: 'used', fmt: pct }] }),
    util: new LiveChart({ id: 'util', title: 'Device utilisation (busy / simulated time)', axes: [{ scale: 'f', label: 'busy', fmt: pct }] }),
  };
  charts.push(...Object.values(C));
  // For tests and the curious: per chart, each series' label and how many
  // plotted points have a value.
  state.charts = () => Object.fromEntries(Object.entries(C).map(([id, c]) => [id,
    [...c.series.values()].map((s) => ({ label: s.label, points: s.data.filter((v) => v !== null).length }))]));

  const byReplica = (a, b) => Number(a) - Number(b) || a.localeCompare(b);

  function plotPoint(sum, rates) {
    xs.push(sum.simulated);
    state.samples = xs.length;
    C.throughput.add({
      tokens: { label: 'tokens/s', scale: 'tok', value: rates ? rates.tokensPerS : null, color: PALETTE[0] },
      finished: { label: 'finished req/s', scale: 'req', value: rates ? rates.finishedPerS : null, color: PALETTE[1] },
    });
    for (const k of ['ttft', 'tbt']) {
      const v = {};
      M.QUANTILES.forEach((q, i) => {
        v[`p${q * 100}`] = { label: `p${q * 100}`, value: rates ? rates.latency[k][i] : null, color: QCOLORS[i] };
      });
      C[k].add(v);
    }
    const batch = {}, queue = {}, kv = {};
    for (const r of Object.keys(sum.replicas).sort(byReplica)) {
      const rep = sum.replicas[r];
      const color = PALETTE[Number(r) % PALETTE.length] || PALETTE[0];
      batch[r] = { label: `replica ${r}`, value: rep.batch, color };
      queue[r] = { label: `replica ${r}`, value: rep.queue, color };
      kv[r] = { label: `replica ${r}`, value: rep.kvTotal > 0 ? rep.kvUsed / rep.kvTotal : null, color };
    }
    C.batch.add(batch); C.queue.add(queue); C.kv.add(kv);
    const util = {};
    const devKeys = Object.keys(sum.devices).sort((a, b) => {
      const da = sum.devices[a], db = sum.devices[b];
      return byReplica(da.replica, db.replica) || (da.device === 'xpu' ? -1 : db.device === 'xpu' ? 1 : da.device.localeCompare(db.device));
    });
    for (const key of devKeys) {
      // colour: the replica; solid: its xPU, dashed: attention devices
      const d = sum.devices[key];
      util[key] = {
        label: `r${d.replica} ${d.device}${d.kind && d.kind !== d.device ? ` (${d.kind})` : ''}`,
        value: rates ? rates.util[key] : null,
        color: PALETTE[Number(d.replica) % PALETTE.length] || PALETTE[0],
        dash: d.device === 'xpu' ? undefined : [6, 3],
      };
    }
    C.util.add(util);
    if (xs.length > MAX_POINTS) {
      const keep = xs.filter((_, i, a) => i % 2 === 1 || i === a.length - 1);
      xs.length = 0; xs.push(...keep);
      charts.forEach((c) => c.decimate());
      state.samples = xs.length;
    }
    charts.forEach((c) => c.render());
  }

  function showHeader(sum) {
    document.getElementById('v-scenario').textContent = sum.scenario + (sum.version ? ` · ${sum.version}` : '');
    setValue('v-simulated', sum.simulated, fmtSimTime(sum.simulated) + (sum.simulated >= 120 ? ` (${intFmt.format(sum.simulated)} s)` : ''));
    const progress = sum.trace > 0 ? Math.min(1, sum.simulated / sum.trace) : NaN;
    setValue('v-progress', progress, Number.isFinite(progress) ? `${(progress * 100).toFixed(1)}% of ${fmtSimTime(sum.trace)}` : '–');
    setValue('v-rtf', sum.rtf, Number.isFinite(sum.rtf) ? `${+sum.rtf.toPrecision(4)}×` : '–');
    setValue('v-arrived', sum.arrived, fmtInt(sum.arrived));
    setValue('v-finished', sum.finished, fmtInt(sum.finished));
    const reasons = Object.entries(sum.rejectedByReason).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${fmtInt(v)}`);
    setValue('v-rejected', sum.rejected, fmtInt(sum.rejected) + (reasons.length ? ` (${reasons.join(', ')})` : ''));
    setValue('v-preempted', sum.preempted, fmtInt(sum.preempted));
    setValue('v-tokens', sum.tokens, fmtInt(sum.tokens));
    const ttft = M.histogramQuantile(0.99, sum.hist.ttft.buckets);
    const tbt = M.histogramQuantile(0.99, sum.hist.tbt.buckets);
    setValue('v-ttft-p99', ttft, fmtSeconds(ttft));
    setValue('v-tbt-p99', tbt, fmtSeconds(tbt));
    setValue('v-energy', sum.energy, fmtEnergy(sum.energy));
  }

  function setStatus(s) {
    state.status = s;
    const el = document.getElementById('v-status');
    el.dataset.value = s;
    el.textContent = s;
  }
  function showError(msg) {
    state.error = msg;
    const el = document.getElementById('error');
    el.hidden = !msg;
    el.textContent = msg || '';
  }

  let lastPlotted = null; // summary of the last plotted point
  const ZERO = M.summarize(M.parse('servesim_simulated_seconds 0'));
  function ingest(text) {
    const sum = M.summarize(M.parse(text));
    if (!sum.seen.servesim_simulated_seconds) throw new Error('/metrics has no servesim_simulated_seconds: is this a servesim metrics endpoint?');
    state.scrapes++;
    state.last = sum;
    showHeader(sum);
    if (lastPlotted && sum.simulated < lastPlotted.simulated) {
      // A new run behind the same address: start over.
      xs.length = 0;
      charts.forEach((c) => { c.series.clear(); c.render(); });
      lastPlotted = null;
    }
    if (!lastPlotted || sum.simulated > lastPlotted.simulated) {
      // Counters start at zero at simulated time zero, so the first point's
      // rates are the averages since the start of the run.
      const rates = M.derive(lastPlotted || ZERO, sum);
      state.lastRates = rates;
      plotPoint(sum, rates);
      lastPlotted = sum;
    }
    return sum;
  }

  // A run started with --metrics-token-file wants the token on /metrics:
  // the page takes it from its address (#token=...; a fragment never
  // reaches the server's logs).
  const token = new URLSearchParams(location.hash.slice(1)).get('token');
  const headers = token ? { Authorization: `Bearer ${token}` } : {};

  let failures = 0;
  async function poll() {
    let delay = POLL_MS;
    try {
      const res = await fetch('metrics', { cache: 'no-store', headers });
      if (res.status === 401) {
        throw new Error(token
          ? 'GET /metrics: HTTP 401: the token in this address (#token=...) is not the run\'s'
          : 'GET /metrics: HTTP 401: this run wants its token (servesim --metrics-token-file): open this page as ...#token=TOKEN');
      }
      if (!res.ok) throw new Error(`GET /metrics: HTTP ${res.status}`);
      const sum = ingest(await res.text());
      failures = 0;
      showError(null);
      if (sum.done) { setStatus('done'); return; } // final values are in; stop polling
      setStatus('running');
    } catch (e) {
      failures++;
      setStatus(state.status === 'done' ? 'done' : 'disconnected');
      showError(`${e.message}${failures > 1 ? ` (${failures} failures, retrying)` : ''}`);
      delay = Math.min(5000, POLL_MS * 2 ** Math.min(failures, 4));
    }
    setTimeout(poll, delay);
  }
  poll();
})();
