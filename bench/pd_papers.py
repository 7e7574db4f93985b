#!/usr/bin/env python3
"""Two published disaggregation headlines, each on its paper's own setup.

  bench/pd_papers.py splitwise [--traces conv,code] [--budget 40] [--duration 600]
  bench/pd_papers.py distserve [--requests-per-gpu 100] [--seeds 10]
  (after scripts/setup.sh; --jobs N runs N simulations at once, default 2)

splitwise: Splitwise (Patel et al., ISCA'24) compares LLM inference clusters
at equal power: DGX-H100 and DGX-A100 machines serving Llama-2-70B (one TP8
instance per machine), colocated (Baseline-H100, Baseline-A100) or split into
prompt and token machines (Splitwise-HH, -HA, -AA), on Poisson arrivals whose
prompt and answer sizes come from the Azure LLM inference traces of 2023
(conversation and code). A design's throughput is the highest request rate
at which nine latency SLOs hold: the p50/p90/p99 of each request's TTFT, TBT
and end-to-end time divided by the same request's time alone on one DGX-A100
must stay under 2/3/6 (TTFT) and 1.25/1.5/5 (TBT, E2E). Machine power and
cost are the relative figures of the paper's simulator (DGX-H100: power 44,
cost 4.76; DGX-A100: 24.8, 2.21), so the power of N DGX-H100 buys
floor(44 N / 24.8) DGX-A100. For each design and each split of its machines
into prompt and token ones, the rate is bisected; the best split is printed.

distserve: DistServe (Zhong et al., OSDI'24) compares per-GPU goodput on the
chatbot workload: OPT-13B on A100-80GB GPUs, ShareGPT prompts and answers,
Poisson arrivals, TTFT <= 0.25 s and TPOT <= 0.1 s, goodput = the highest
request rate per GPU at which 90% of the requests meet both, with 100
requests per GPU in a run as in the paper's artifact (here 10 runs pooled
per rate). vLLM (of 2023: prefill-first batching, no chunked prefill) runs
on one GPU, beside vLLM v1's chunked prefill; DistServe places a TP2 prefill
and a TP1 decode instance on 3 GPUs of one node (KV over NVLink), and every
other placement of 3 GPUs is printed too, as DistServe's placement search
would weigh them.

docs/disaggregation.md sets a run's figures beside the papers'.
"""
import argparse
import concurrent.futures
import csv
import functools
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ------------------------------------------------------------ common ----


def pairs_from(path, prompt_col, answer_col, context):
    """A trace's (prompt, answer) pairs that fit the model's context, and
    the share of those that did not."""
    with open(os.path.join(ROOT, path)) as f:
        rows = [(int(r[prompt_col]), int(r[answer_col])) for r in csv.DictReader(f)]
    fit = [r for r in rows if sum(r) <= context]
    return fit, 1 - len(fit) / len(rows)


def poisson(pairs, rate, seed, duration=None, count=None):
    """Poisson arrivals at `rate` for `duration` s or `count` requests;
    (prompt, answer) pairs drawn with replacement. The pair stream does not
    depend on the rate (common random numbers): request i is the same
    request in every probe."""
    arrivals, sizer = random.Random(seed), random.Random(seed + 1)
    t, out = arrivals.expovariate(rate), []
    while (duration is None or t < duration) and (count is None or len(out) < count):
        out.append((t, *sizer.choice(pairs)))
        t += arrivals.expovariate(rate)
    return out


def write_trace(path, reqs):
    with open(path, "w") as f:
        f.write("arrival_s,input_tokens,output_tokens\n")
        for t, i, o in reqs:
            f.write(f"{t:.6f},{i},{o}\n")


def scenario(model, batching, trace, prefill, decode=None, share_nodes=False):
    """A servesim scenario. A pool is (node preset, replicas, TP); without
    a decode pool the prefill one is a colocated cluster. `share_nodes`: the
    decode pool starts on the prefill pool's last node (KV over NVLink)."""
    def pool(p):
        node, replicas, tp = p
        return f'replicas: {replicas} tensor_parallel: {tp} node {{ preset: "{node}" }}'
    text = f'model {{ preset: "{model}" }}\n'
    if decode is None:
        text += f"cluster {{ {pool(prefill)} }}\n"
    else:
        text += ("cluster {\n  disaggregation {\n"
                 f"    prefill {{ cluster {{ {pool(prefill)} }} }}\n"
                 f"    decode {{ cluster {{ {pool(decode)} }} }}\n"
                 "    kv_transfer: KV_TRANSFER_POLICY_LAYERWISE\n"
                 f"    share_nodes: {'true' if share_nodes else 'false'}\n  }}\n}}\n")
    return text + (f'workload {{ trace {{ path: "{trace}" }} }}\n'
                   f"scheduler {{ batching: {batching} }}\n"
                   "output { iterations_csv: false timeline: false report_html: false "
                   "links_csv: false }\nseed: 1\n")


def simulate(binary, work, tag, reqs, *scenario_args):
    """Runs servesim on `reqs`; the rows of requests.csv."""
    trace = os.path.join(work, tag + ".csv")
    write_trace(trace, reqs)
    path = os.path.join(work, tag + ".pbtxt")
    with open(path, "w") as f:
        f.write(scenario(scenario_args[0], scenario_args[1], trace, *scenario_args[2:]))
    out = os.path.join(work, tag)
    subprocess.run([binary, "run", path, "--quiet", "--out", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "requests.csv")) as f:
        rows = list(csv.DictReader(f))
    shutil.rmtree(out)
    os.remove(trace)
    return rows


def times(row):
    """(ttft, tbt, e2e) of a finished request, None if it did not finish.
    TBT is the request's mean time between tokens (its TPOT), as both
    papers count it."""
    if row["status"] != "done":
        return None
    return float(row["ttft_s"]), float(row["tpot_s"]), float(row["e2e_s"])


def quantile(sorted_values, q):  # linear interpolation, as pandas' default
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def max_rate(probe, start, cap):
    """The highest rate (to 2%) at which probe(rate) returns no missed
    SLO, and what the lowest failing rate probed missed. Doubles from
    `start` up to `cap`, then bisects."""
    missed = {}
    lo, hi = 0.0, start
    while not missed.setdefault(hi, probe(hi)):
        if hi >= cap:
            return hi, []
        lo, hi = hi, min(2 * hi, cap)
    while hi - lo > 0.02 * hi:
        mid = (lo + hi) / 2
        missed[mid] = probe(mid)
        if missed[mid]:
            hi = mid
        else:
            lo = mid
    return lo, missed[hi]


def binary_path():
    binary = os.environ.get("SERVESIM_BIN", os.path.join(ROOT, "build/services/servesim"))
    if not os.access(binary, os.X_OK):
        sys.exit("build first: scripts/setup.sh")
    return binary


# --------------------------------------------------------- splitwise ----

AZURE = {
    "conv": "examples/traces/AzureLLMInferenceTrace_conv.csv",
    "code": "examples/traces/AzureLLMInferenceTrace_code.csv",
}
# Relative machine power and cost (the paper's simulator,
# Mutinifni/splitwise-sim, notebooks/utils.py).
POWER = {"h100": 44.0, "a100": 24.8}
COST = {"h100": 4.76, "a100": 2.21}
DGX = {"h100": "dgx-h100", "a100": "dgx-a100"}
# Slowdown limits at p50, p90, p99.
SPLITWISE_SLO = {"ttft": (2.0, 3.0, 6.0), "tbt": (1.25, 1.5, 5.0), "e2e": (1.25, 1.5, 5.0)}
QUANTILES = (0.5, 0.9, 0.99)
LLAMA2_CONTEXT = 4096  # longer requests are refused
SOLO_GAP_S = 200.0  # longer than any request alone (code: 7.4k + 1.9k tokens)


def splitwise_missed(rows, solo):
    """The SLOs a run misses, e.g. ["ttft p99"]; empty if it meets all."""
    slow = {"ttft": [], "tbt": [], "e2e": []}
    for row in rows:
        got = times(row)
        if got is None:
            return [f"request {row['id']} {row['status']}"]
        alone = solo[int(row["input_tokens"]), int(row["output_tokens"])]
        for k, a, g in zip(("ttft", "tbt", "e2e"), alone, got):
            if k == "tbt" and int(row["output_tokens"]) < 2:
                continue
            slow[k].append(g / a)
    missed = []
    for k, limits in SPLITWISE_SLO.items():
        v = sorted(slow[k])
        missed += [f"{k} p{round(100 * q)}" for q, lim in zip(QUANTILES, limits)
                   if v and quantile(v, q) > lim]
    return missed


def splitwise_designs(budget, step):
    """(name, prefill pool, decode pool or None) for each design and split:
    prompt machines in steps of `step` DGX-H100s' power (the paper sweeps
    5, 10, ... 35 of 40)."""
    a100s = int(POWER["h100"] * budget // POWER["a100"])
    a_step = max(1, round(step * POWER["h100"] / POWER["a100"]))
    m = lambda kind, n: (DGX[kind], n, 8)
    yield "Baseline-H100", m("h100", budget), None
    yield "Baseline-A100", m("a100", a100s), None
    for p in range(step, budget, step):
        yield "Splitwise-HH", m("h100", p), m("h100", budget - p)
    for p in range(a_step, a100s, a_step):
        yield "Splitwise-AA", m("a100", p), m("a100", a100s - p)
    for p in range(step, budget, step):
        yield "Splitwise-HA", m("h100", p), m("a100", int(POWER["h100"] * (budget - p) // POWER["a100"]))


def splitwise_reference(binary, work, name):
    """A trace's pairs that fit, the share that did not, and each distinct
    pair's (ttft, tbt, e2e) alone on one DGX-A100."""
    pairs, dropped = pairs_from(AZURE[name], "ContextTokens", "GeneratedTokens", LLAMA2_CONTEXT)
    distinct = sorted(set(pairs))
    rows = simulate(binary, work, f"solo_{name}",
                    [(k * SOLO_GAP_S, i, o) for k, (i, o) in enumerate(distinct)],
                    "llama2-70b", "BATCHING_POLICY_VLLM_V1", (DGX["a100"], 1, 8))
    solo = {distinct[int(r["id"])]: times(r) for r in rows}
    assert len(solo) == len(distinct) and None not in solo.values()
    return pairs, dropped, solo


def splitwise_probe(binary, work, pairs, solo, seed, duration, prefill, decode, tag, rate):
    """The SLOs a design misses at `rate` (Poisson arrivals for `duration` s)."""
    reqs = poisson(pairs, rate, seed, duration=duration)
    rows = simulate(binary, work, f"{tag}_{rate:.4f}", reqs, "llama2-70b",
                    "BATCHING_POLICY_VLLM_V1", prefill, decode)
    return splitwise_missed(rows, solo)


# 5 req/s per DGX-H100 of power is near every design's reach on these
# traces; 40 is far beyond it: the rate search's start and cap.
SPLITWISE_START, SPLITWISE_CAP = 5.0, 40.0


def splitwise(args, binary, work):
    kind = {DGX[k]: k for k in DGX}
    for name in args.traces.split(","):
        pairs, dropped, solo = splitwise_reference(binary, work, name)
        step = args.split_step or max(1, args.budget // 8)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            jobs = [(label, prefill, decode, pool.submit(
                        max_rate, functools.partial(splitwise_probe, binary, work, pairs, solo,
                                                    args.seed, args.duration, prefill, decode,
                                                    f"{name}_{label}_{prefill[1]}"),
                        SPLITWISE_START * args.budget, SPLITWISE_CAP * args.budget))
                    for label, prefill, decode in splitwise_designs(args.budget, step)
                    if decode is None or decode[1] >= 1]
        best = {}
        for label, prefill, decode, fut in jobs:
            rate, missed = fut.result()
            pools = [p for p in (prefill, decode) if p]
            power = sum(POWER[kind[p[0]]] * p[1] for p in pools)
            cost = sum(COST[kind[p[0]]] * p[1] for p in pools)
            if label not in best or rate > best[label][0]:
                best[label] = (rate, prefill[1], decode and decode[1], power, cost, missed)
        print(f"\n{name}: Llama-2-70B, the power of {args.budget} DGX-H100, "
              f"{args.duration:.0f} s of Poisson arrivals, sizes from the Azure {name} trace "
              f"(the {100 * dropped:.1f}% longer than the context left out)")
        print(f"{'design':<15} {'machines':>12} {'req/s':>7} {'vs H100':>8} {'vs A100':>8} "
              f"{'power':>6} {'cost':>6} {'req/s/cost':>10}  above it, misses")
        base_h, base_a = best["Baseline-H100"][0], best["Baseline-A100"][0]
        for label, (rate, prompt, token, power, cost, missed) in best.items():
            machines = f"{prompt}" if token is None else f"{prompt}P + {token}T"
            print(f"{label:<15} {machines:>12} {rate:>7.2f} {rate / base_h:>7.2f}x "
                  f"{rate / base_a:>7.2f}x {power:>6.0f} {cost:>6.1f} {rate / cost:>10.3f}  "
                  f"{', '.join(missed)}")
        sys.stdout.flush()


# --------------------------------------------------------- distserve ----

SHAREGPT = "examples/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
OPT_CONTEXT = 2048
DISTSERVE_TTFT_S, DISTSERVE_TPOT_S, DISTSERVE_ATTAINMENT = 0.25, 0.1, 0.9
A100 = "dgx-a100"  # A100-80GB SXM, as DistServe's testbed


def distserve_missed(runs):
    """[] if at least 90% of the requests of all runs meet both SLOs, else
    what the attainment was."""
    rows = [r for run in runs for r in run]
    met = sum(1 for r in rows if (t := times(r)) and t[0] <= DISTSERVE_TTFT_S
              and t[1] <= DISTSERVE_TPOT_S)
    share = met / len(rows)
    return [] if share >= DISTSERVE_ATTAINMENT else [f"{100 * share:.1f}% within SLO"]


def distserve_rates(args, binary, work):
    """[(label, GPUs, best rate per GPU, what the rate above it missed)] for
    each system, and the share of ShareGPT pairs longer than the context."""
    pairs, dropped = pairs_from(SHAREGPT, "num_prefill_tokens", "num_decode_tokens", OPT_CONTEXT)
    # (label, prefill pool, decode pool or None); a pool is (node, replicas, TP).
    systems = [
        ("vLLM, 1 GPU", (A100, 1, 1), None, "BATCHING_POLICY_PREFILL_FIRST"),
        ("vLLM v1 (chunked), 1 GPU", (A100, 1, 1), None, "BATCHING_POLICY_VLLM_V1"),
        ("P/D 2 x TP1 + 1 x TP1", (A100, 2, 1), (A100, 1, 1), "BATCHING_POLICY_PREFILL_FIRST"),
        ("P/D 1 x TP2 + 1 x TP1", (A100, 1, 2), (A100, 1, 1), "BATCHING_POLICY_PREFILL_FIRST"),
        ("P/D 1 x TP1 + 2 x TP1", (A100, 1, 1), (A100, 2, 1), "BATCHING_POLICY_PREFILL_FIRST"),
        ("P/D 1 x TP1 + 1 x TP2", (A100, 1, 1), (A100, 1, 2), "BATCHING_POLICY_PREFILL_FIRST"),
    ]

    def gpus(prefill, decode):
        return sum(p[1] * p[2] for p in (prefill, decode) if p)

    def probe(prefill, decode, batching, tag, per_gpu_rate):
        n = gpus(prefill, decode)
        return distserve_missed([
            simulate(binary, work, f"{tag}_{per_gpu_rate:.4f}_{seed}",
                     poisson(pairs, per_gpu_rate * n, seed, count=args.requests_per_gpu * n),
                     "opt-13b", batching, prefill, decode, decode is not None)
            for seed in range(args.seed, args.seed + args.seeds)])

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        jobs = [(label, gpus(prefill, decode), pool.submit(
                    max_rate, functools.partial(probe, prefill, decode, batching, f"ds{k}"),
                    1.0, 64.0))
                for k, (label, prefill, decode, batching) in enumerate(systems)]
        return [(label, n, *fut.result()) for label, n, fut in jobs], dropped


def distserve(args, binary, work):
    rates, dropped = distserve_rates(args, binary, work)
    print(f"\ndistserve: OPT-13B on A100-80GB, ShareGPT ({100 * dropped:.1f}% longer than the "
          f"context left out), Poisson arrivals, {args.seeds} runs of {args.requests_per_gpu} requests per GPU; "
          f"TTFT <= {DISTSERVE_TTFT_S} s, TPOT <= {DISTSERVE_TPOT_S} s for "
          f"{100 * DISTSERVE_ATTAINMENT:.0f}%")
    print(f"{'system':<28} {'GPUs':>4} {'req/s/GPU':>9} {'vs vLLM':>8}  above it")
    base = None
    for label, gpus, rate, missed in rates:
        base = base or rate
        print(f"{label:<28} {gpus:>4} {rate:>9.3f} {rate / base:>7.2f}x  {', '.join(missed)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", choices=("splitwise", "distserve"))
    ap.add_argument("--traces", default="conv,code", help="splitwise: Azure traces")
    ap.add_argument("--budget", type=int, default=40,
                    help="splitwise: the power of this many DGX-H100 machines")
    ap.add_argument("--duration", type=float, default=600.0,
                    help="splitwise: seconds of arrivals")
    ap.add_argument("--split-step", type=int, default=0,
                    help="splitwise: prompt machines tried in steps of this many "
                         "(default: budget / 8)")
    ap.add_argument("--requests-per-gpu", type=int, default=100,
                    help="distserve: requests per GPU in a run (the paper's artifact: 100)")
    ap.add_argument("--seeds", type=int, default=10,
                    help="distserve: runs per rate, their requests pooled")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    binary = binary_path()
    with tempfile.TemporaryDirectory() as work:
        (splitwise if args.study == "splitwise" else distserve)(args, binary, work)


if __name__ == "__main__":
    main()
