// Unit tests of dashboards/web/metrics.js: the dashboard's Prometheus
// text-format parser, histogram_quantile estimate and per-interval rates.
// Run: node --test tests/browser/metrics_parser_test.js
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const M = require(path.join(__dirname, '..', '..', 'dashboards', 'web', 'metrics.js'));

const near = (a, b, eps = 1e-9) => assert.ok(Math.abs(a - b) <= eps * Math.max(1, Math.abs(b)), `${a} != ${b}`);

test('parses samples, labels, escapes, special values and comments', () => {
  const p = M.parse([
    '# HELP servesim_x_total A "help" line',
    '# TYPE servesim_x_total counter',
    'servesim_x_total{replica="0",reason="too_long"} 3',
    'servesim_x_total{ replica = "1" , reason="a\\"b\\\\c\\nd",} 1.5e+16 1700000000000',
    '# a free comment',
    '',
    'servesim_g 42\r',
    'servesim_h_bucket{le="+Inf"} +Inf',
    'servesim_n NaN',
    'servesim_m -Inf',
  ].join('\n'));
  assert.equal(p.types.servesim_x_total, 'counter');
  assert.equal(p.help.servesim_x_total, 'A "help" line');
  assert.equal(p.samples.length, 6);
  assert.deepEqual(p.samples[0], { name: 'servesim_x_total', labels: { replica: '0', reason: 'too_long' }, value: 3 });
  assert.deepEqual(p.samples[1].labels, { replica: '1', reason: 'a"b\\c\nd' });
  assert.equal(p.samples[1].value, 1.5e16);
  assert.deepEqual(p.samples[2], { name: 'servesim_g', labels: {}, value: 42 });
  assert.equal(p.samples[3].labels.le, '+Inf');
  assert.equal(p.samples[3].value, Infinity);
  assert.ok(Number.isNaN(p.samples[4].value));
  assert.equal(p.samples[5].value, -Infinity);
});

test('rejects malformed lines with the line number', () => {
  assert.throws(() => M.parse('servesim_a{replica="0"'), /line 1/);
  assert.throws(() => M.parse('ok 1\nservesim_a{replica=0} 1'), /line 2: expected '"'/);
  assert.throws(() => M.parse('servesim_a abc'), /bad sample value "abc"/);
  assert.throws(() => M.parse('servesim_a'), /line 1: expected "value/);
  assert.throws(() => M.parse('servesim_a 1 2 3'), /line 1/);
  assert.throws(() => M.parse('9bad 1'), /bad metric name/);
});

// Worked examples checked by hand against Prometheus' bucketQuantile.
test('histogramQuantile matches Prometheus semantics', () => {
  const b = [{ le: 0.1, count: 10 }, { le: 0.5, count: 60 }, { le: 1, count: 90 }, { le: Infinity, count: 100 }];
  near(M.histogramQuantile(0.05, b), 0.05);           // first bucket: lower bound 0
  near(M.histogramQuantile(0.5, b), 0.1 + 0.4 * 40 / 50);
  near(M.histogramQuantile(0.9, b), 1);                // exactly the bucket's top
  assert.equal(M.histogramQuantile(0.99, b), 1);       // in +Inf: highest finite bound
  assert.equal(M.histogramQuantile(-0.1, b), -Infinity);
  assert.equal(M.histogramQuantile(1.1, b), Infinity);
  // unordered input is sorted; no observations / no +Inf / single bucket -> NaN
  near(M.histogramQuantile(0.5, [...b].reverse()), 0.42);
  assert.ok(Number.isNaN(M.histogramQuantile(0.5, b.map((x) => ({ le: x.le, count: 0 })))));
  assert.ok(Number.isNaN(M.histogramQuantile(0.5, b.slice(0, 3))));
  assert.ok(Number.isNaN(M.histogramQuantile(0.5, [{ le: Infinity, count: 5 }])));
  // non-monotonic cumulative counts are forced monotonic
  const bumpy = [{ le: 1, count: 10 }, { le: 2, count: 9 }, { le: 4, count: 20 }, { le: Infinity, count: 20 }];
  // (forced to 10, 10, 20, 20: rank 15 lies in le=4 with 5 of 10 -> 3; unforced it would be 2 + 2 * 6/11)
  near(M.histogramQuantile(0.75, bumpy), 3);
});

test('histogramQuantile: rank inside a middle bucket interpolates linearly', () => {
  const b = [{ le: 1, count: 10 }, { le: 2, count: 10 }, { le: 4, count: 20 }, { le: Infinity, count: 20 }];
  near(M.histogramQuantile(0.5, b), 1);     // rank 10: first bucket with count >= 10 is le=1
  near(M.histogramQuantile(0.75, b), 3);    // rank 15: le=4 bucket, 5 of 10 -> 2 + 2*0.5
});

const SCRAPE = (t, done, finished0, tokens0, busy0, ttft) => `
# TYPE servesim_requests_finished_total counter
servesim_requests_finished_total{replica="0"} ${finished0}
servesim_requests_finished_total{replica="1"} 5
servesim_requests_arrived_total{replica="0"} ${finished0 + 2}
servesim_requests_arrived_total{replica="1"} 6
servesim_requests_rejected_total{reason="too_long",replica="0"} 2
servesim_requests_rejected_total{reason="kv_capacity",replica="1"} 1
servesim_requests_preempted_total{replica="0"} 4
servesim_tokens_generated_total{replica="0"} ${tokens0}
servesim_tokens_generated_total{replica="1"} 100
servesim_device_busy_seconds_total{device="xpu",kind="gpu",replica="0"} ${busy0}
servesim_device_busy_seconds_total{device="attacc",kind="attacc",replica="0"} 1
servesim_energy_joules_total{device="xpu",kind="gpu",replica="0"} 1000
servesim_energy_joules_total{device="attacc",kind="attacc",replica="0"} 24
servesim_queue_length{replica="0"} 3
servesim_batch_size{replica="0"} 7
servesim_kv_blocks_used{replica="0"} 25
servesim_kv_blocks_total{replica="0"} 100
servesim_simulated_seconds ${t}
servesim_realtime_factor 600
servesim_trace_seconds 3600
servesim_run_done ${done}
servesim_run_info{scenario="demo \\"x\\"",version="0.1.0"} 1
# TYPE servesim_ttft_seconds histogram
servesim_ttft_seconds_count{replica="0"} ${ttft[2]}
servesim_ttft_seconds_sum{replica="0"} 1
servesim_ttft_seconds_bucket{replica="0",le="0.1"} ${ttft[0]}
servesim_ttft_seconds_bucket{replica="0",le="1"} ${ttft[1]}
servesim_ttft_seconds_bucket{replica="0",le="+Inf"} ${ttft[2]}
servesim_ttft_seconds_count{replica="1"} 10
servesim_ttft_seconds_sum{replica="1"} 2
servesim_ttft_seconds_bucket{replica="1",le="0.1"} 0
servesim_ttft_seconds_bucket{replica="1",le="1"} 10
servesim_ttft_seconds_bucket{replica="1",le="+Inf"} 10
`;

test('summarize sums over replicas and keeps per-replica and per-device values', () => {
  const s = M.summarize(M.parse(SCRAPE(100, 0, 20, 1000, 50, [4, 8, 10])));
  assert.equal(s.simulated, 100);
  assert.equal(s.done, false);
  assert.equal(s.scenario, 'demo "x"');
  assert.equal(s.finished, 25);
  assert.equal(s.arrived, 28);
  assert.equal(s.tokens, 1100);
  assert.equal(s.rejected, 3);
  assert.deepEqual(s.rejectedByReason, { too_long: 2, kv_capacity: 1 });
  assert.equal(s.preempted, 4);
  assert.equal(s.energy, 1024);
  assert.equal(s.rtf, 600);
  assert.equal(s.trace, 3600);
  assert.deepEqual(s.replicas['0'], { arrived: 22, finished: 20, tokens: 1000, queue: 3, batch: 7, kvUsed: 25, kvTotal: 100 });
  assert.equal(s.devices['0/xpu'].busy, 50);
  assert.equal(s.devices['0/xpu'].kind, 'gpu');
  assert.equal(s.devices['0/attacc'].energy, 24);
  assert.deepEqual(s.hist.ttft.buckets, [{ le: 0.1, count: 4 }, { le: 1, count: 18 }, { le: Infinity, count: 20 }]);
  assert.equal(s.hist.ttft.count, 20);
  assert.equal(s.hist.ttft.sum, 3);
  assert.deepEqual(s.hist.tbt.buckets, []);
  assert.equal(M.summarize(M.parse(SCRAPE(100, 1, 0, 0, 0, [0, 0, 0]))).done, true);
});

test('derive: rates per simulated second and interval quantiles', () => {
  const a = M.summarize(M.parse(SCRAPE(100, 0, 20, 1000, 50, [4, 8, 10])));
  const b = M.summarize(M.parse(SCRAPE(300, 1, 60, 5000, 150, [4, 48, 50])));
  const d = M.derive(a, b);
  assert.equal(d.dt, 200);
  assert.equal(d.t, 300);
  near(d.tokensPerS, 4000 / 200);
  near(d.finishedPerS, 40 / 200);
  near(d.util['0/xpu'], 100 / 200);
  near(d.util['0/attacc'], 0);
  // ttft increase: 0 below 0.1, 40 below 1, 40 total -> p50 = 0.1 + 0.9 * 20/40
  near(d.latency.ttft[0], 0.55);
  near(d.latency.ttft[1], 0.1 + 0.9 * 36 / 40);
  // no TBT observed in the interval -> NaN (a gap, not a zero)
  assert.ok(d.latency.tbt.every(Number.isNaN));
  // simulated time did not advance -> nothing to plot
  assert.equal(M.derive(b, b), null);
  // a counter that went down restarted from zero
  assert.equal(M.increase(10, 4), 4);
  assert.equal(M.increase(4, 10), 6);
});
