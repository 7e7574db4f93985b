#!/usr/bin/env python3
"""bench/pd_papers.py's arithmetic: its percentiles, Splitwise's slowdown SLOs and designs, the
rate search on a fake probe, the arrivals' common random numbers, and one small simulation
through servesim (argv[1], when given)."""
import importlib.util
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("pd_papers", os.path.join(ROOT, "bench", "pd_papers.py"))
pp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pp)
SERVESIM = sys.argv.pop(1) if len(sys.argv) > 1 else None


def row(i, prompt, answer, ttft, tpot, e2e, status="done"):
    return {"id": str(i), "input_tokens": str(prompt), "output_tokens": str(answer),
            "ttft_s": str(ttft), "tpot_s": str(tpot), "e2e_s": str(e2e), "status": status}


class QuantileTest(unittest.TestCase):
    def test_linear_interpolation_as_pandas(self):
        v = [1.0, 2.0, 3.0, 4.0]
        self.assertAlmostEqual(pp.quantile(v, 0.5), 2.5)
        self.assertAlmostEqual(pp.quantile(v, 0.9), 3.7)
        self.assertAlmostEqual(pp.quantile(v, 0.99), 3.97)
        self.assertEqual(pp.quantile([5.0], 0.99), 5.0)


class SplitwiseSloTest(unittest.TestCase):
    solo = {(100, 10): (0.1, 0.02, 0.28)}

    def rows(self, ttft, tpot, e2e, n=100):
        return [row(i, 100, 10, ttft, tpot, e2e) for i in range(n)]

    def test_a_request_as_fast_as_alone_meets_every_slo(self):
        self.assertEqual(pp.splitwise_missed(self.rows(0.1, 0.02, 0.28), self.solo), [])

    def test_each_limit_is_its_percentiles_slowdown(self):
        # TBT 1.3x its time alone for every request: over p50's 1.25, under p90's 1.5.
        self.assertEqual(pp.splitwise_missed(self.rows(0.1, 0.026, 0.28), self.solo), ["tbt p50"])
        # Two requests in a hundred at 7x TTFT: p99 (6x) only.
        rows = self.rows(0.1, 0.02, 0.28)
        rows[0]["ttft_s"] = rows[1]["ttft_s"] = "0.7"
        self.assertEqual(pp.splitwise_missed(rows, self.solo), ["ttft p99"])

    def test_an_unfinished_request_misses(self):
        rows = self.rows(0.1, 0.02, 0.28)
        rows[3]["status"] = "rejected_too_long"
        self.assertEqual(pp.splitwise_missed(rows, self.solo), ["request 3 rejected_too_long"])

    def test_one_token_answers_have_no_tbt(self):
        solo = {(100, 1): (0.1, 0.0, 0.1)}
        rows = [row(i, 100, 1, 0.1, 0.0, 0.1) for i in range(10)]
        self.assertEqual(pp.splitwise_missed(rows, solo), [])


class SplitwiseDesignsTest(unittest.TestCase):
    def test_the_power_of_40_h100_machines(self):
        d = {}
        for label, prefill, decode in pp.splitwise_designs(40, 5):
            d.setdefault(label, []).append((prefill, decode))
        self.assertEqual(d["Baseline-H100"], [(("dgx-h100", 40, 8), None)])
        self.assertEqual(d["Baseline-A100"], [(("dgx-a100", 70, 8), None)])
        self.assertEqual([p[1] + t[1] for p, t in d["Splitwise-HH"]], [40] * 7)
        # 5 H100s' power is 9 A100s': 9, 18, ... 63 prompt machines of 70.
        self.assertEqual([(p[1], t[1]) for p, t in d["Splitwise-AA"]][:2], [(9, 61), (18, 52)])
        # 25 H100 prompt machines leave 15 x 44 / 24.8 = 26.6 A100s' power.
        self.assertIn((("dgx-h100", 25, 8), ("dgx-a100", 26, 8)), d["Splitwise-HA"])


class MaxRateTest(unittest.TestCase):
    def test_bisects_to_two_percent_below_the_edge(self):
        probed = []

        def probe(rate):
            probed.append(rate)
            return [] if rate <= 37.3 else [f"at {rate}"]

        rate, missed = pp.max_rate(probe, 10.0, 400.0)
        self.assertLessEqual(rate, 37.3)
        self.assertGreater(rate, 37.3 * 0.98)
        self.assertEqual(probed[:3], [10.0, 20.0, 40.0])
        self.assertEqual(missed, [f"at {min(r for r in probed if r > 37.3)}"])

    def test_stops_at_the_cap(self):
        self.assertEqual(pp.max_rate(lambda rate: [], 10.0, 25.0), (25.0, []))


class ArrivalsTest(unittest.TestCase):
    def test_the_pairs_do_not_depend_on_the_rate(self):
        pairs = [(i, i + 1) for i in range(50)]
        slow = pp.poisson(pairs, 1.0, 7, duration=100.0)
        fast = pp.poisson(pairs, 3.0, 7, duration=100.0)
        self.assertGreater(len(fast), 2 * len(slow))
        self.assertEqual([r[1:] for r in fast[:len(slow)]], [r[1:] for r in slow])
        self.assertEqual(len(pp.poisson(pairs, 3.0, 7, count=17)), 17)


@unittest.skipIf(SERVESIM is None, "no servesim binary given")
class SimulateTest(unittest.TestCase):
    def test_a_disaggregated_scenario_runs_every_request(self):
        with tempfile.TemporaryDirectory() as work:
            rows = pp.simulate(SERVESIM, work, "t", [(0.0, 500, 20), (0.1, 900, 5)], "opt-13b",
                               "BATCHING_POLICY_PREFILL_FIRST", ("dgx-a100", 1, 2),
                               ("dgx-a100", 1, 1))
            self.assertEqual([r["status"] for r in rows], ["done", "done"])
            self.assertEqual([r["output_tokens"] for r in rows], ["20", "5"])
            self.assertEqual(sorted(os.listdir(work)), ["t.pbtxt"])


if __name__ == "__main__":
    unittest.main()
