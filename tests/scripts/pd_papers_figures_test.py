#!/usr/bin/env python3
"""docs/disaggregation.md's tables of bench/pd_papers.py, pinned.

  pd_papers_figures_test.py SERVESIM splitwise TRACE DESIGN[,DESIGN...]
  pd_papers_figures_test.py SERVESIM distserve

splitwise: a design's figure is the rate at which the script's search (from 5 req/s per DGX-H100
of power, doubling, then bisecting to 2%) stops on the design's best split. Its last two probes
are rerun on the published split: at the published rate every SLO must hold, and at the lowest
failing rate probed above it the run must miss what the table's "misses" column says. That pins
each row's rate to the bisection's step and its misses in two runs instead of the whole search
(43 minutes on 2 cores); which split is best is not searched again. The columns derived from the
rates and machines (ratios, power, cost) are checked against the table too.

distserve: the whole comparison (10 runs of 100 requests per GPU at each rate), then its column
of one run of 1,000 requests per GPU.
"""
import argparse
import importlib.util
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("pd_papers", os.path.join(ROOT, "bench", "pd_papers.py"))
pp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pp)

BUDGET = 40  # the power of 40 DGX-H100
# The table, "Splitwise: throughput at equal power": per trace and design,
# (prompt machines' kind, count), (token machines' kind, count) or None,
# req/s, vs Baseline-H100, vs Baseline-A100, power, cost, misses.
SPLITWISE = {
    "conv": {
        "Baseline-H100": (("h100", 40), None, 387.5, 1.00, 2.21, 1760, 190.4, ["tbt p50"]),
        "Baseline-A100": (("a100", 70), None, 175.0, 0.45, 1.00, 1736, 154.7, ["tbt p50"]),
        "Splitwise-HH": (("h100", 25), ("h100", 15), 462.5, 1.19, 2.64, 1760, 190.4, ["ttft p99"]),
        "Splitwise-AA": (("a100", 45), ("a100", 25), 284.4, 0.73, 1.62, 1736, 154.7, ["ttft p99"]),
        "Splitwise-HA": (("h100", 25), ("a100", 26), 418.8, 1.08, 2.39, 1745, 176.5, ["tbt p50"]),
    },
    "code": {
        "Baseline-H100": (("h100", 40), None, 271.9, 1.00, 1.78, 1760, 190.4, ["tbt p90"]),
        "Baseline-A100": (("a100", 70), None, 153.1, 0.56, 1.00, 1736, 154.7, ["tbt p90"]),
        "Splitwise-HH": (("h100", 35), ("h100", 5), 381.3, 1.40, 2.49, 1760, 190.4, ["ttft p99"]),
        "Splitwise-AA": (("a100", 63), ("a100", 7), 231.3, 0.85, 1.51, 1736, 154.7, ["ttft p99"]),
        "Splitwise-HA": (("h100", 35), ("a100", 8), 375.0, 1.38, 2.45, 1738, 184.3, ["ttft p99"]),
    },
}

# The table, "DistServe: per-GPU goodput": per system, req/s per GPU and
# vs vLLM over 10 runs of 100 requests per GPU, then over one run of 1,000.
DISTSERVE = [
    ("vLLM, 1 GPU", 1, 5.25, 1.00, 2.91, 1.00),
    ("vLLM v1 (chunked), 1 GPU", 1, 4.25, 0.81, 2.97, 1.02),
    ("P/D 2 x TP1 + 1 x TP1", 3, 1.28, 0.24, 1.14, 0.39),
    ("P/D 1 x TP2 + 1 x TP1", 3, 1.28, 0.24, 1.14, 0.39),
    ("P/D 1 x TP1 + 2 x TP1", 3, 1.69, 0.32, 1.66, 0.57),
    ("P/D 1 x TP1 + 1 x TP2", 3, 1.84, 0.35, 1.78, 0.61),
]

SERVESIM = None


def search_edge(published, start, cap):
    """The search's last passing and lowest failing probe when everything up
    to the published rate (printed to 0.1) passes."""
    probed = []

    def probe(rate):
        probed.append(rate)
        return [] if rate <= published + 0.0501 else ["above"]

    lo, _ = pp.max_rate(probe, start, cap)
    return lo, min(r for r in probed if r > lo)


class SplitwiseArithmeticTest(unittest.TestCase):
    """The columns derived from each row's rate and machines."""

    def test_ratios_power_and_cost(self):
        start, cap = pp.SPLITWISE_START * BUDGET, pp.SPLITWISE_CAP * BUDGET
        for trace, rows in SPLITWISE.items():
            # The rates the search found, as the script divides them.
            rate = {d: search_edge(row[2], start, cap)[0] for d, row in rows.items()}
            base_h, base_a = rate["Baseline-H100"], rate["Baseline-A100"]
            for design, (prompt, token, _, vs_h, vs_a, power, cost, _) in rows.items():
                with self.subTest(trace=trace, design=design):
                    pools = [p for p in (prompt, token) if p]
                    self.assertEqual(f"{rate[design] / base_h:.2f}", f"{vs_h:.2f}")
                    self.assertEqual(f"{rate[design] / base_a:.2f}", f"{vs_a:.2f}")
                    self.assertAlmostEqual(sum(pp.POWER[k] * n for k, n in pools), power, delta=0.5)
                    self.assertAlmostEqual(sum(pp.COST[k] * n for k, n in pools), cost, delta=0.05)


class SplitwiseTest(unittest.TestCase):
    trace = None
    designs = []

    def test_the_search_stops_at_the_published_rate(self):
        with tempfile.TemporaryDirectory() as work:
            pairs, dropped, solo = pp.splitwise_reference(SERVESIM, work, self.trace)
            # "The 8.3% and 14.3% of pairs longer than Llama-2's 4,096-token
            # context are left out".
            self.assertAlmostEqual(100 * dropped, {"conv": 8.3, "code": 14.3}[self.trace],
                                   delta=0.05)
            for design in self.designs:
                prompt, token, rate, *_, misses = SPLITWISE[self.trace][design]
                with self.subTest(design=design):
                    lo, hi = search_edge(rate, pp.SPLITWISE_START * BUDGET,
                                         pp.SPLITWISE_CAP * BUDGET)
                    self.assertAlmostEqual(lo, rate, delta=0.0501)  # printed to 0.1
                    machines = [p and (pp.DGX[p[0]], p[1], 8) for p in (prompt, token)]

                    def probe(r):
                        return pp.splitwise_probe(SERVESIM, work, pairs, solo, 1, 600.0,
                                                  *machines, design, r)

                    self.assertEqual(probe(lo), [], f"at {lo} req/s")
                    self.assertEqual(probe(hi), misses, f"at {hi} req/s")


class DistServeTest(unittest.TestCase):
    def test_rates_per_gpu(self):
        for requests, seeds, col in ((100, 10, 2), (1000, 1, 4)):
            args = argparse.Namespace(requests_per_gpu=requests, seeds=seeds, seed=1, jobs=1)
            with tempfile.TemporaryDirectory() as work:
                rates, dropped = pp.distserve_rates(args, SERVESIM, work)
            self.assertAlmostEqual(1 - dropped, 0.47, delta=0.005)  # "the 47% that fit"
            self.assertEqual([r[:2] for r in rates], [(w[0], w[1]) for w in DISTSERVE])
            for (label, _, rate, _), want in zip(rates, DISTSERVE):
                with self.subTest(system=label, requests_per_gpu=requests):
                    # Printed to 0.01; the search's steps are 1/64 req/s or more apart.
                    self.assertAlmostEqual(rate, want[col], delta=0.005)
                    self.assertAlmostEqual(rate / rates[0][2], want[col + 1], delta=0.005)


def main():
    global SERVESIM
    if len(sys.argv) < 3 or sys.argv[2] not in ("splitwise", "distserve"):
        sys.exit(__doc__)
    SERVESIM = sys.argv[1]
    suite = unittest.TestSuite([SplitwiseArithmeticTest("test_ratios_power_and_cost")])
    if sys.argv[2] == "splitwise":
        SplitwiseTest.trace = sys.argv[3]
        SplitwiseTest.designs = sys.argv[4].split(",")
        suite.addTest(SplitwiseTest("test_the_search_stops_at_the_published_rate"))
    else:
        suite.addTest(DistServeTest("test_rates_per_gpu"))
    sys.exit(0 if unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful() else 1)


if __name__ == "__main__":
    main()
