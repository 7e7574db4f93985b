"""Helpers for the live-metrics tests: start a servesim run with --metrics,
read its address from stderr, fetch and parse /metrics. Python 3 stdlib only."""
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request

SKIP = 77


def skip(msg):
    print(f"SKIP: {msg}", flush=True)
    sys.exit(SKIP)


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


class Servesim:
    """A `servesim run ... --metrics 127.0.0.1:0` child process (its address: .base, .address)."""

    def __init__(self, binary, scenario, pace=None, linger=10, sets=(), web_dir=None, timeout=30, metrics="127.0.0.1:0"):
        args = [binary, "run", scenario, "--quiet", "--metrics", metrics, "--linger", str(linger)]
        if pace is not None:
            args += ["--pace", str(pace)]
        if web_dir:
            args += ["--web-dir", web_dir]
        for s in sets:
            args += ["--set", s]
        print("starting:", " ".join(args), flush=True)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.stderr = b""
        deadline = time.monotonic() + timeout
        fd = self.proc.stderr.fileno()
        while True:
            m = re.search(rb"metrics: (http://[^\s/]+/)", self.stderr)
            if m:
                self.base = m.group(1).decode()
                break
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                fail(f"servesim printed no 'metrics: http://...' line within {timeout} s; stderr:\n{self.stderr.decode(errors='replace')}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:  # stderr closed: servesim exited
                    rc = self.proc.wait()
                    fail(f"servesim exited ({rc}) before serving metrics; stderr:\n{self.stderr.decode(errors='replace')}")
                self.stderr += chunk
        self.address = self.base[len("http://"):].rstrip("/")
        # Keep draining stderr so that servesim never blocks on a full pipe.
        def drain():
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                self.stderr += chunk
        threading.Thread(target=drain, daemon=True).start()

    def metrics(self):
        with urllib.request.urlopen(self.base + "metrics", timeout=10) as r:
            if r.status != 200:
                fail(f"GET {self.base}metrics: HTTP {r.status}")
            return r.read().decode()

    def wait_done(self, timeout):
        """Polls /metrics until servesim_run_done is 1; returns that scrape."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.metrics()
            if metric_sum(parse(text), "servesim_run_done") == 1:
                return text
            time.sleep(0.2)
        fail(f"servesim_run_done did not become 1 within {timeout} s")

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse(text):
    """Prometheus text format -> {"types": {family: type}, "samples": [(name, labels, value)]}."""
    types, samples = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _SAMPLE.match(line)
        if not m:
            fail(f"/metrics line {n} is not a sample: {line!r}")
        labels = {}
        body = m.group(2) or ""
        pos = 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                fail(f"/metrics line {n}: bad labels {body!r}")
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        samples.append((m.group(1), labels, float(m.group(3))))
    return {"types": types, "samples": samples}


def metric_sum(parsed, name):
    values = [v for n, _, v in parsed["samples"] if n == name]
    if not values:
        fail(f"/metrics has no {name}")
    return sum(values)
