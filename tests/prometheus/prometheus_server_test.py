#!/usr/bin/env python3
"""Debian's Prometheus server scrapes a paced servesim run; its HTTP API
returns the run's metrics.

prometheus_server_test.py --servesim BIN --scenario FILE --config dashboards/prometheus/prometheus.yml
                          [--dashboard GRAFANA_JSON] [--pace X] [--linger S] [--prometheus PATH]
                          [--set path=value ...]

Starts `prometheus` on a free loopback port with the repository's scrape
config pointed at another free loopback port and a temporary storage dir,
then servesim with --metrics on that port (so that Prometheus, which takes
seconds to start, sees the whole run), waits until Prometheus has scraped the end of
the run, then checks over /api/v1/query and /api/v1/query_range that the
finished-request counter arrived (per replica, never above servesim's own
final count, non-decreasing over time), that the target is up and that the
TTFT histogram is usable by histogram_quantile. With --dashboard, every
PromQL query of the Grafana dashboard runs on this Prometheus at a moment
of the run and must return series with a finite value
(SERVESIM_TEST_VERBOSE=1 prints them). Exit 77 (skip) when the
prometheus binary is not installed. Python 3 stdlib only.
"""
import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servesim_live as live  # noqa: E402

DEFAULT_TARGET = "127.0.0.1:9464"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base, path, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        live.fail(f"GET {url}: HTTP {e.code}: {e.read().decode(errors='replace')}")
    if body.get("status") != "success":
        live.fail(f"GET {url}: {body}")
    return body["data"]


def query(base, q):
    return api(base, "/api/v1/query", query=q)["result"]


def start_prometheus(binary, config, storage, log):
    """Starts prometheus on a free loopback port; returns (proc, base URL)."""
    for attempt in range(3):
        port = free_port()
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={storage}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return proc, base
            except OSError:
                pass
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            live.fail(f"prometheus did not become ready on {base} within 60 s")
        # exited (e.g. the port was taken in between): try another port
    log.flush()
    with open(log.name) as f:
        live.fail(f"prometheus exited ({proc.returncode}) three times; its log:\n{f.read()}")


def series_times(base, t0):
    """Timestamps at which Prometheus holds a scrape of the running (not yet done) run."""
    r = api(base, "/api/v1/query_range", query='servesim_run_done{job="servesim"} == 0',
            start=f"{t0 - 5:.3f}", end=f"{time.time():.3f}", step="0.5")["result"]
    return [float(t) for t, _ in r[0]["values"]] if r else []


def grafana_queries(path, base, instance, running_times):
    """Runs every query of the Grafana dashboard, Grafana's variables filled in,
    at the last moment the run was still going; each must return a finite value."""
    with open(path) as f:
        dash = json.load(f)
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend((p.get("title"), t["expr"]) for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    if not exprs:
        return [f"{path} has no queries"]
    if len(running_times) < 3:
        return [f"only {len(running_times)} evaluation points while the run was going; cannot run the Grafana queries"]
    at = running_times[-2]  # a rate window ending here holds several running scrapes
    problems = []
    for title, expr in exprs:
        q = (expr.replace("$__rate_interval", "4s").replace("${instance}", instance).replace("$instance", instance))
        if "$" in q:
            problems.append(f"Grafana panel {title!r}: unknown variable in {expr!r}")
            continue
        url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q, 'time': f'{at:.3f}'})}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            problems.append(f"Grafana panel {title!r}: Prometheus rejects {q!r}: {e.read().decode(errors='replace')}")
            continue
        if os.environ.get("SERVESIM_TEST_VERBOSE"):
            print(f"  {title}: {[(r['metric'], r['value'][1]) for r in body['data']['result']][:3]}", flush=True)
        if body.get("status") != "success" or not body["data"]["result"]:
            problems.append(f"Grafana panel {title!r}: {q!r} returned no series at {at:.1f}: {body}")
        elif not any(math.isfinite(float(r["value"][1])) for r in body["data"]["result"]):
            problems.append(f"Grafana panel {title!r}: {q!r} has no finite value at {at:.1f}: {body['data']['result']}")
    print(f"prometheus: {len(exprs)} Grafana queries evaluated during the run, {len(problems)} problems", flush=True)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servesim", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--config", required=True, help="the repository's scrape config (target " + DEFAULT_TARGET + ")")
    ap.add_argument("--dashboard", help="Grafana JSON whose queries must run on this Prometheus")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--pace", default="300")
    ap.add_argument("--linger", default="20")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args()

    if not os.access(a.prometheus, os.X_OK):
        live.skip(f"{a.prometheus} not found: the Prometheus server is not installed "
                  "(Debian package 'prometheus'; run scripts/setup_dashboard_tests.sh)")
    with open(a.config) as f:
        config_text = f.read()
    if DEFAULT_TARGET not in config_text:
        live.fail(f"{a.config} does not scrape {DEFAULT_TARGET}")
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "config", a.config], capture_output=True, text=True)
        if r.returncode != 0:
            live.fail(f"promtool check config {a.config}:\n{r.stdout}{r.stderr}")

    tmp = tempfile.mkdtemp(prefix="servesim-prometheus-")
    run = prom = None
    try:
        target = f"127.0.0.1:{free_port()}"
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(config_text.replace(DEFAULT_TARGET, target))
        log = open(os.path.join(tmp, "prometheus.log"), "w")
        prom, base = start_prometheus(a.prometheus, config, os.path.join(tmp, "data"), log)
        # Targets reach Prometheus' scrape loop some seconds after it is ready
        # (discovery updates are throttled): wait for ours before starting.
        deadline = time.monotonic() + 30
        while not any(t.get("scrapeUrl", "").startswith(f"http://{target}/")
                      for t in api(base, "/api/v1/targets").get("activeTargets", [])):
            if time.monotonic() > deadline:
                live.fail(f"prometheus did not pick up the scrape target {target} within 30 s")
            time.sleep(0.2)
        t0 = time.time()
        run = live.Servesim(a.servesim, a.scenario, pace=a.pace, linger=a.linger, sets=a.sets, metrics=target)
        if run.address != target:
            live.fail(f"servesim listens on {run.address}, asked for {target}")
        print(f"servesim at {run.base}, prometheus at {base}", flush=True)

        # servesim's own final values (the run ends; servesim lingers).
        final_text = run.wait_done(timeout=600)
        final = live.parse(final_text)
        final_finished = live.metric_sum(final, "servesim_requests_finished_total")
        replicas = sorted({l["replica"] for n, l, _ in final["samples"] if n == "servesim_requests_finished_total"})
        print(f"run done: {final_finished:.0f} requests finished on {len(replicas)} replicas", flush=True)

        # Prometheus scrapes the end of the run while servesim lingers.
        deadline = time.monotonic() + float(a.linger) - 2
        done = []
        while time.monotonic() < deadline:
            done = query(base, 'servesim_run_done{job="servesim"}')
            if done and float(done[0]["value"][1]) == 1:
                break
            time.sleep(0.5)
        else:
            log.flush()
            with open(log.name) as f:
                live.fail(f"prometheus never scraped servesim_run_done == 1 (last: {done}); its log:\n{f.read()}")

        problems = []
        up = query(base, 'up{job="servesim"}')
        if not up or float(up[0]["value"][1]) != 1:
            problems.append(f"up{{job=\"servesim\"}} is {up}")
        result = query(base, "servesim_requests_finished_total")
        got = {r["metric"].get("replica"): float(r["value"][1]) for r in result}
        print("prometheus: servesim_requests_finished_total", got, flush=True)
        if sorted(got) != replicas:
            problems.append(f"per-replica series {sorted(got)} != replicas on /metrics {replicas}")
        if any(r["metric"].get("job") != "servesim" or r["metric"].get("instance") != run.address for r in result):
            problems.append(f"unexpected job/instance labels: {[r['metric'] for r in result]}")
        total = sum(got.values())
        if not 0 < total <= final_finished:
            problems.append(f"sum of scraped finished requests {total} not in (0, {final_finished}]")

        # Over time: scrapes during the run, never decreasing, never above the end.
        def series(q):
            r = api(base, "/api/v1/query_range", query=q, start=f"{t0 - 5:.3f}", end=f"{time.time():.3f}", step="0.5")["result"]
            return [float(v) for _, v in r[0]["values"]] if r else []
        for _ in range(10):  # at least three scrapes (a slow start may have caught only the end)
            values = series('sum(servesim_requests_finished_total{job="servesim"})')
            if len(values) >= 6:
                break
            time.sleep(0.5)
        running = series('servesim_run_done{job="servesim"} == 0')
        if not running:
            problems.append("prometheus scraped no sample while the run was going (servesim_run_done == 0)")
        print(f"prometheus: {len(values)} points of sum(finished) over the run: {values[:3]} ... {values[-3:]}", flush=True)
        if len(values) < 6:
            problems.append(f"only {len(values)} points at 0.5 s steps over the run (scrape_interval 1s)")
        if any(b < a_ for a_, b in zip(values, values[1:])):
            problems.append(f"finished requests decreased between scrapes: {values}")
        if values and max(values) > final_finished:
            problems.append(f"a scrape saw {max(values)} finished, above the final {final_finished}")

        q = query(base, 'histogram_quantile(0.5, sum by (le) (servesim_ttft_seconds_bucket{job="servesim"}))')
        p50 = float(q[0]["value"][1]) if q else math.nan
        print(f"prometheus: TTFT p50 over the run {p50:.4g} s", flush=True)
        if not (p50 > 0 and math.isfinite(p50)):
            problems.append(f"histogram_quantile over servesim_ttft_seconds_bucket gave {q}")

        if a.dashboard:
            problems += grafana_queries(a.dashboard, base, run.address, series_times(base, t0))

        if problems:
            live.fail("\n- " + "\n- ".join(problems))
        print("PASS")
    finally:
        if prom and prom.poll() is None:
            prom.terminate()
            try:
                prom.wait(timeout=15)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        if run:
            run.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
