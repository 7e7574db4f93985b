#!/usr/bin/env python3
"""The live dashboard's server under idle and trickling connections.

Starts a paced `servesim run --metrics 127.0.0.1:0`, opens 300 connections
that never send a byte and 50 that send a request one byte every half
second, all from loopback, then asks for /metrics five times: each must
answer 200 within 5 s (services/http_guard.h). Loopback only; bounded.

Usage: http_guard_load_test.py SERVESIM_BINARY
"""
import os
import re
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "gpt3_175b_dgx_azure_conv.pbtxt")


def get_metrics(port, timeout):
    """Seconds until a whole 200 answer, or None."""
    t0 = time.time()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while time.time() - t0 < timeout:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
    except OSError:
        return None
    ok = data.startswith(b"HTTP/1.1 200") and b"servesim_" in data
    return time.time() - t0 if ok else None


def main():
    binary = sys.argv[1]
    run = subprocess.Popen(
        [binary, "run", EXAMPLE, "--quiet", "--metrics", "127.0.0.1:0", "--pace", "50",
         "--set", "workload.window_end_s=3000"],
        stderr=subprocess.PIPE, text=True)
    port = None
    for line in run.stderr:
        m = re.match(r"metrics: http://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
            break
    failures = []
    stop = threading.Event()
    try:
        if port is None:
            failures.append("no metrics address printed")
            return failures
        if get_metrics(port, 5) is None:
            failures.append("no answer before the load")
        idle = []
        for _ in range(300):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                pass

        def trickle():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                for c in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200:
                    if stop.is_set():
                        break
                    s.send(bytes([c]))
                    time.sleep(0.5)
            except OSError:
                pass

        threads = [threading.Thread(target=trickle, daemon=True) for _ in range(50)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        for i in range(5):
            took = get_metrics(port, 5)
            print(f"GET /metrics under load: {'no answer' if took is None else f'{took:.3f} s'}")
            if took is None:
                failures.append(f"GET {i + 1} of 5 under load got no answer within 5 s")
            time.sleep(0.5)
    finally:
        stop.set()
        run.terminate()
        run.wait(timeout=30)
    return failures


if __name__ == "__main__":
    failed = main()
    for f in failed:
        print("FAIL:", f)
    sys.exit(1 if failed else 0)
