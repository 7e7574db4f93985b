#!/usr/bin/env node
// End-to-end test of the live dashboard: starts a paced servesim run with
// --metrics and a token (--metrics-token-file), opens the page it serves in
// Debian's headless Chromium through playwright-core, first without the
// token (it must say how to give it) and then with it (#token=...), waits
// for the charts to fill, waits for the run to end and checks the page's
// final values against /metrics. Saves a screenshot.
//
// node tests/browser/dashboard_test.js --servesim BIN --scenario FILE
//      [--web-dir DIR] [--screenshot PNG] [--npm-dir DIR] [--pace X]
//      [--linger S] [--chromium PATH] [--set path=value ...]
// Exit: 0 pass, 1 fail, 77 skip (Chromium or playwright-core unavailable).
'use strict';
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const SKIP = 77;
const T0 = Date.now();
const log = (...a) => console.log(`[${((Date.now() - T0) / 1000).toFixed(1)}s]`, ...a);
const REPO = path.resolve(__dirname, '..', '..');

function parseArgs(argv) {
  const o = {
    servesim: null, scenario: null, webDir: path.join(REPO, 'dashboards', 'web'),
    screenshot: null, npmDir: null, pace: '600', linger: '15',
    chromium: process.env.CHROMIUM || '/usr/bin/chromium', sets: [],
  };
  const keys = { '--servesim': 'servesim', '--scenario': 'scenario', '--web-dir': 'webDir', '--screenshot': 'screenshot',
    '--npm-dir': 'npmDir', '--pace': 'pace', '--linger': 'linger', '--chromium': 'chromium' };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
    if (a === '--set') o.sets.push(argv[++i]);
    else if (keys[a]) o[keys[a]] = argv[++i];
    else throw new Error(`unknown argument ${a}`);
  }
  if (!o.servesim || !o.scenario) throw new Error('--servesim and --scenario are required');
  return o;
}

function skip(msg) {
  console.log(`SKIP: ${msg}`);
  process.exit(SKIP);
}

// playwright-core from tests/browser/node_modules (scripts/setup_dashboard_tests.sh)
// or, failing that, `npm ci` into --npm-dir from the pinned package-lock.json.
function loadPlaywright(npmDir) {
  // The pinned playwright-core (1.61, the last release for Node 18) runs on
  // Debian 12's own nodejs 18 as on newer Node.
  const major = Number(process.versions.node.split('.')[0]);
  const wanted = require('./package.json').dependencies['playwright-core'];
  if (major < 18) throw new Error(`playwright-core ${wanted} needs Node >= 18; this is ${process.versions.node}`);
  const tryLoad = (dir) => {
    try { return require(require.resolve('playwright-core', { paths: [dir] })); } catch { return null; }
  };
  let pw = tryLoad(__dirname) || (npmDir && tryLoad(npmDir));
  if (pw) return pw;
  if (!npmDir) skip('playwright-core is not installed (run scripts/setup_dashboard_tests.sh)');
  fs.mkdirSync(npmDir, { recursive: true });
  for (const f of ['package.json', 'package-lock.json']) fs.copyFileSync(path.join(__dirname, f), path.join(npmDir, f));
  log(`installing playwright-core into ${npmDir} (npm ci)`);
  const r = spawnSync('npm', ['ci', '--prefix', npmDir, '--no-audit', '--no-fund', '--loglevel=error'], { encoding: 'utf8' });
  if (r.status !== 0) {
    skip(`playwright-core could not be installed with npm ci (${r.error ? r.error.message : `exit ${r.status}`}):\n${(r.stderr || '').trim()}`);
  }
  pw = tryLoad(npmDir);
  if (!pw) throw new Error(`npm ci succeeded but playwright-core does not load from ${npmDir}`);
  return pw;
}

// Starts servesim and resolves with {child, base, stderr()} once it prints
// "metrics: http://HOST:PORT/".
function startServesim(o, tokenFile) {
  const args = ['run', o.scenario, '--quiet', '--metrics', '127.0.0.1:0', '--pace', o.pace, '--linger', o.linger, '--web-dir', o.webDir,
    '--metrics-token-file', tokenFile];
  for (const s of o.sets) args.push('--set', s);
  log(`starting: ${o.servesim} ${args.join(' ')}`);
  const child = spawn(o.servesim, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`servesim printed no "metrics: http://..." line within 30 s; stderr:\n${err}`)), 30000);
    child.on('error', (e) => { clearTimeout(timer); reject(new Error(`cannot start ${o.servesim}: ${e.message}`)); });
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d) => {
      err += d;
      const m = /metrics: (http:\/\/[^\s/]+\/)/.exec(err);
      if (m) { clearTimeout(timer); resolve({ child, base: m[1], exited, stderr: () => err }); }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`servesim exited (${signal || code}) before serving metrics; stderr:\n${err}`));
    });
  });
}

// Independent of the page's parser: sums the samples of one metric.
function metricSum(text, name) {
  const re = new RegExp(`^${name}(?:\\{[^}]*\\})?\\s+(\\S+)`, 'gm');
  let sum = 0, n = 0, m;
  while ((m = re.exec(text))) { sum += Number(m[1]); n++; }
  if (n === 0) throw new Error(`/metrics has no ${name}`);
  return sum;
}

async function main() {
  const o = parseArgs(process.argv);
  if (!fs.existsSync(o.chromium)) skip(`${o.chromium} not found: Chromium is not installed (Debian package "chromium"; run scripts/setup_dashboard_tests.sh)`);
  const { chromium } = loadPlaywright(o.npmDir);
  const failures = [];
  const check = (ok, msg) => { if (!ok) failures.push(msg); };

  // Chromium starts before servesim does: on a loaded 2-core machine its
  // start-up alone has taken longer than the paced run (CI once saw the page
  // open after the run had ended, with one point to plot).
  let browser = await chromium.launch({ executablePath: o.chromium, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  // A first layout with text and a canvas, so font and graphics set-up on a
  // fresh machine are done before the run's clock starts too.
  await page.setContent('<p>servesim</p><canvas width="8" height="8"></canvas>');
  log('browser ready');
  let run;
  // The run wants a token on /metrics (--metrics-token-file): the page
  // without it says how to give it; with it (#token=...) it plots.
  const token = 'dashboard-test-' + process.pid;
  const tokenDir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'servesim-token-'));
  const tokenFile = path.join(tokenDir, 'token');
  fs.writeFileSync(tokenFile, token + '\n', { mode: 0o600 });
  const auth = { Authorization: `Bearer ${token}` };
  try {
    run = await startServesim(o, tokenFile);
    const origin = new URL(run.base).origin;
    log(`dashboard at ${run.base}`);
    const offOrigin = [];
    const pageErrors = [];
    let tokenless = true;  // 401s are expected until the page has the token
    page.on('request', (r) => { if (new URL(r.url()).origin !== origin && !r.url().startsWith('data:')) offOrigin.push(r.url()); });
    page.on('pageerror', (e) => pageErrors.push(`page error: ${e.message}`));
    page.on('console', (m) => { if (m.type() === 'error' && !(tokenless && /401/.test(m.text()))) pageErrors.push(`console error: ${m.text()}`); });
    page.on('response', (r) => { if (r.status() >= 400 && !(tokenless && r.status() === 401)) pageErrors.push(`HTTP ${r.status()} for ${r.url()}`); });

    const bare = await fetch(new URL('metrics', run.base));
    check(bare.status === 401, `GET /metrics without the token: HTTP ${bare.status}, expected 401`);
    let resp = await page.goto(run.base);
    if (!resp || !resp.ok()) throw new Error(`GET ${run.base}: ${resp ? `HTTP ${resp.status()}` : 'no response'}`);
    await page.waitForFunction(() => window.servesimDashboard && /wants its token/.test(window.servesimDashboard.error || ''), null, { timeout: 30000 })
      .catch(async (e) => {
        const st = await page.evaluate(() => window.servesimDashboard && { status: window.servesimDashboard.status, error: window.servesimDashboard.error });
        throw new Error(`without the token the page should say it wants one (${JSON.stringify(st)}): ${e.message}`);
      });
    log('without the token the page asks for it');
    await page.goto('about:blank');
    tokenless = false;
    resp = await page.goto(`${run.base}#token=${encodeURIComponent(token)}`);
    if (!resp || !resp.ok()) throw new Error(`GET ${run.base}#token=...: ${resp ? `HTTP ${resp.status()}` : 'no response'}`);

    // Charts have data while the run is going.
    await page.waitForFunction(() => window.servesimDashboard && window.servesimDashboard.samples > 3, null, { timeout: 60000 })
      .catch(async (e) => {
        const st = await page.evaluate(() => window.servesimDashboard && { samples: window.servesimDashboard.samples, status: window.servesimDashboard.status, error: window.servesimDashboard.error });
        throw new Error(`the page never plotted more than 3 points (${JSON.stringify(st)}): ${e.message}`);
      });
    const midStatus = await page.evaluate(() => window.servesimDashboard.status);
    log(`charts have data; status ${midStatus}`);

    // The run ends; the page says so.
    const runSeconds = 120 + Number(o.linger);
    await page.waitForFunction(() => window.servesimDashboard.status === 'done', null, { timeout: runSeconds * 1000 });

    // Final values: /metrics now (the run is done, servesim lingers) vs the page.
    const res = await fetch(new URL('metrics', run.base), { headers: auth });
    check(res.ok, `GET /metrics: HTTP ${res.status}`);
    const text = await res.text();
    check(metricSum(text, 'servesim_run_done') === 1, 'page says done but servesim_run_done is not 1');
    const want = {
      'v-finished': metricSum(text, 'servesim_requests_finished_total'),
      'v-arrived': metricSum(text, 'servesim_requests_arrived_total'),
      'v-tokens': metricSum(text, 'servesim_tokens_generated_total'),
      'v-simulated': metricSum(text, 'servesim_simulated_seconds'),
    };
    check(want['v-finished'] > 0 && want['v-tokens'] > 0, `the run finished nothing: ${JSON.stringify(want)}`);
    const shown = await page.evaluate((ids) => Object.fromEntries(ids.map((id) => {
      const el = document.getElementById(id);
      return [id, el ? { value: el.dataset.value, text: el.textContent } : null];
    })), [...Object.keys(want), 'v-status', 'v-rtf']);
    log('shown:', JSON.stringify(shown));
    log('/metrics:', JSON.stringify(want));
    for (const [id, v] of Object.entries(want)) {
      const s = shown[id];
      if (!s) { failures.push(`#${id} missing from the page`); continue; }
      check(Number(s.value) === v, `#${id} holds ${s.value}, /metrics says ${v}`);
      const expectText = id === 'v-simulated' ? (v >= 120 ? `${Math.round(v).toLocaleString('en-US')} s` : `${+v.toFixed(1)}s`)
        : v.toLocaleString('en-US', { maximumFractionDigits: 0 });
      check(s.text.includes(expectText), `#${id} shows "${s.text}", expected it to show ${expectText}`);
    }
    check(shown['v-status'] && shown['v-status'].text === 'done', `#v-status shows ${JSON.stringify(shown['v-status'])}`);
    check(shown['v-rtf'] && Number(shown['v-rtf'].value) > 0, `#v-rtf shows ${JSON.stringify(shown['v-rtf'])}`);

    // Every chart has a series with plotted values; the last parsed scrape agrees.
    const st = await page.evaluate(() => ({ samples: window.servesimDashboard.samples, last: window.servesimDashboard.last, charts: window.servesimDashboard.charts() }));
    for (const [id, series] of Object.entries(st.charts)) {
      const best = Math.max(0, ...series.map((s) => s.points));
      check(best >= 2, `chart ${id} has no series with 2+ plotted values: ${JSON.stringify(series)}`);
    }
    check(st.last.finished === want['v-finished'] && st.last.tokens === want['v-tokens'] && st.last.simulated === want['v-simulated'],
      `servesimDashboard.last disagrees with /metrics: ${JSON.stringify({ finished: st.last.finished, tokens: st.last.tokens, simulated: st.last.simulated })}`);
    const replicas = Object.keys(st.last.replicas).length;
    check(st.charts.batch.length === replicas && st.charts.kv.length === replicas, `batch/KV charts should have one series per replica (${replicas}): ${JSON.stringify(st.charts.batch)}`);
    check(st.charts.util.length === Object.keys(st.last.devices).length && st.charts.util.length > 0, `utilisation chart should have one series per device: ${JSON.stringify(st.charts.util)}`);
    const canvases = await page.locator('#charts .uplot canvas').count();
    check(canvases === Object.keys(st.charts).length, `expected ${Object.keys(st.charts).length} chart canvases, found ${canvases}`);
    check(offOrigin.length === 0, `the page reached beyond its origin: ${offOrigin.join(', ')}`);
    check(pageErrors.length === 0, pageErrors.join('\n'));
    log(`${st.samples} points plotted, ${replicas} replicas, ${st.charts.util.length} devices`);

    if (o.screenshot) {
      fs.mkdirSync(path.dirname(o.screenshot), { recursive: true });
      await page.screenshot({ path: o.screenshot, fullPage: true });
      log(`screenshot: ${o.screenshot}`);
    }
    await browser.close();
    browser = null;
    log('browser closed; waiting for servesim to end its --linger');

    // servesim lingers, then exits cleanly by itself.
    const timeout = new Promise((r) => setTimeout(() => r(null), (Number(o.linger) + 20) * 1000).unref());
    const ex = await Promise.race([run.exited, timeout]);
    check(ex !== null, `servesim still running ${Number(o.linger) + 20} s after the run ended (--linger ${o.linger})`);
    if (ex) check(ex.code === 0, `servesim exited with ${ex.signal || ex.code}; stderr:\n${run.stderr()}`);
  } finally {
    fs.rmSync(tokenDir, { recursive: true, force: true });
    if (browser) await browser.close().catch(() => {});
    if (run && run.child.exitCode === null && run.child.signalCode === null) run.child.kill('SIGTERM');
  }
  if (failures.length) {
    console.error(`FAIL:\n- ${failures.join('\n- ')}`);
    process.exit(1);
  }
  log('PASS');
  process.exit(0);
}

main().catch((e) => { console.error(`FAIL: ${e.stack || e.message}`); process.exit(1); });
