#!/usr/bin/env python3
"""bench/ml_energy.py's arithmetic: the tokens a request emits in a window, the benchmark's
steady-state window and its power per GPU on hand-made outputs, and one real point through
servesim (argv[1], when given) against its summary."""
import csv
import importlib.util
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("ml_energy", os.path.join(ROOT, "bench", "ml_energy.py"))
me = importlib.util.module_from_spec(spec)
spec.loader.exec_module(me)
SERVESIM = sys.argv.pop(1) if len(sys.argv) > 1 else None


def request(first, finish, tokens):
    return {"first_token_s": str(first), "finish_s": str(finish), "output_tokens": str(tokens),
            "status": "done"}


class TokensInTest(unittest.TestCase):
    def test_first_token_then_evenly_to_the_finish(self):
        # 11 tokens: the first at 1 s, ten more over 1..3 s (one per 0.2 s).
        r = [request(1.0, 3.0, 11)]
        self.assertAlmostEqual(me.tokens_in(r, 0.0, 10.0), 11.0)
        self.assertAlmostEqual(me.tokens_in(r, 1.0, 2.0), 1 + 5.0)
        self.assertAlmostEqual(me.tokens_in(r, 2.0, 2.5), 2.5)
        self.assertAlmostEqual(me.tokens_in(r, 3.5, 4.0), 0.0)
        self.assertAlmostEqual(me.tokens_in([request(5.0, 5.0, 1)], 4.0, 6.0), 1.0)


class SteadyStateTest(unittest.TestCase):
    def test_window_power_and_throughput_by_hand(self):
        with tempfile.TemporaryDirectory() as d:
            # Four requests, batch 1: the window runs from the 1st first
            # token (1 s) to the 3rd (3 s).
            with open(os.path.join(d, "requests.csv"), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=["first_token_s", "finish_s", "output_tokens",
                                                  "status"])
                w.writeheader()
                for i in range(4):
                    w.writerow(request(1.0 + i, 2.0 + i, 3))
            with open(os.path.join(d, "iterations.csv"), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["start_s", "duration_s", "energy_j"])
                for i in range(10):  # 0.5 s steps of 300 J (on 2 GPUs)
                    w.writerow([0.5 * i, 0.5, 300.0])
            # Idle power 100 W per GPU over a 10 s makespan on 2 GPUs.
            json.dump({"energy_parts_j": {"xpu_idle": 2000.0}, "makespan_s": 10.0},
                      open(os.path.join(d, "summary.json"), "w"))
            watts, tps = me.steady_state(d, 2, 1)
            # Steps starting in [1, 3): four, 2 s and 1200 J; 300 W per GPU
            # above idle. Tokens: 3 + 3 (requests 0 and 1; request 2's first
            # comes at 3 s, the window's open end): 6 in 2 s.
            self.assertAlmostEqual(watts, 100.0 + 1200.0 / (2 * 2.0))
            self.assertAlmostEqual(tps, 6 / 2.0)


@unittest.skipIf(SERVESIM is None, "no servesim binary given")
class RunTest(unittest.TestCase):
    def test_one_point_matches_its_summary(self):
        with tempfile.TemporaryDirectory() as work:
            watts, tps = me.run(SERVESIM, work, "8b", 16, 128, 64)
            s = json.load(open(os.path.join(work, "8b_16", "summary.json")))
            # A busy H100 draws its idle and active power (121.7 + 282 W) and
            # its ops', under its 700 W TDP: 529.0 W here.
            self.assertAlmostEqual(watts, 529.0, delta=0.005 * 529.0)
            # Every request sent at once, all of one length: the batches of
            # 16 repeat, so the window's rate is the run's (to 1.4e-5 here).
            self.assertAlmostEqual(tps / s["throughput_tokens_per_s"], 1.0, delta=1e-4)


if __name__ == "__main__":
    unittest.main()
