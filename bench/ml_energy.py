#!/usr/bin/env python3
"""GPU power and energy per token against ML.ENERGY's measured vLLM runs on H100.

  bench/ml_energy.py [--models 8b,70b,405b] [--jobs 2] [--out DIR]
  (after scripts/setup.sh)

ML.ENERGY's Leaderboard v3.0 (Chung et al., The ML.ENERGY Initiative; vLLM 0.11.1 on H100 SXM,
the lm-arena-chat task) measured Llama-3.1-8B on one GPU, Llama-3.1-70B on four (TP4) and
Llama-3.1-405B-FP8 on eight (TP8) at batch sizes (max_num_seqs) 16 to 1024: the GPUs' energy
(NVML, summed over the GPUs) over a steady-state window, and the output tokens streamed in it.
The figures below are read from the vector data of the plots in "LLM Inference Energy: A
Longitudinal Analysis" (ml-energy/blog, docs/posts/llm-energy-over-time.md, 2026-02-09):
average power of all the instance's GPUs (here per GPU) and output tokens per second; energy
per output token is their ratio (the post's own energy plot agrees at every point).

servesim runs the same setups: the model, the GPUs, tensor parallelism, vLLM v1 scheduling with
max_num_seqs = the batch and max_num_batched_tokens 8192, GPU memory utilisation 0.95, and
every request sent at once (max(1024, 3 x batch) of them, as the benchmark repeats its 1,024
requests for large batches). The benchmark's prompts and answers are LMArena conversations
whose per-model lengths are not published; the runs use the task's published means across models
(634 prompt tokens, 717 output tokens; --input/--output to change). The window is the
benchmark's: from the time the batch-th request has its first token to the time the (N -
batch)-th has. Power = the xPUs' idle power plus each iteration's energy over the window, per
GPU; tokens = those emitted in it.

The H100 preset's busy power (active_power_w, flop_energy_pj) was fitted to the 8B curve
(docs/energy.md, "Busy GPU power"); the 70B and 405B curves were not used and test it.
"""
import argparse
import concurrent.futures
import csv
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (GPUs, preset, model options, {batch: (W per GPU, output tokens/s)}).
MEASURED = {
    "8b": (1, "llama3.1-8b", "", {
        16: (513, 1954), 32: (560, 3391), 64: (610, 5147), 96: (644, 6260), 128: (669, 7037),
        192: (688, 8223), 256: (691, 9010), 384: (687, 9248), 512: (688, 9806)}),
    "70b": (4, "llama3.1-70b", "", {
        16: (451, 863), 32: (449, 1487), 64: (500, 2511), 96: (525, 3244), 128: (546, 3876),
        192: (573, 4461), 256: (589, 4915), 384: (586, 5319), 512: (623, 5921),
        768: (634, 6507), 1024: (637, 6827)}),
    "405b": (8, "llama3.1-405b", "dtype: DTYPE_FP8", {
        16: (423, 446), 32: (468, 786), 64: (520, 1350), 96: (559, 1682), 128: (576, 1896),
        192: (602, 2154), 256: (609, 2363)}),
}


def scenario(key, batch, lin, lout):
    gpus, preset, options, _ = MEASURED[key]
    return f"""name: "ML.ENERGY v3 {key} on {gpus} x H100, batch {batch}"
model {{ preset: "{preset}" {options} }}
cluster {{ xpu {{ preset: "h100-sxm-80gb" }} tensor_parallel: {gpus} memory_utilization: 0.95 }}
workload {{ saturated {{ num_requests: {max(1024, 3 * batch)} input_tokens: {lin} output_tokens: {lout} }} }}
scheduler {{ batching: BATCHING_POLICY_VLLM_V1 max_batch_size: {batch} max_tokens_per_iteration: 8192 }}
output {{ timeline: false report_html: false }}
"""


def tokens_in(requests, t0, t1):
    """Output tokens emitted in [t0, t1): the first at first_token_s, the rest evenly to finish_s."""
    total = 0.0
    for r in requests:
        first, end, n = float(r["first_token_s"]), float(r["finish_s"]), int(r["output_tokens"])
        if t0 <= first < t1:
            total += 1
        if n > 1 and end > first:
            lo, hi = max(t0, first), min(t1, end)
            if hi > lo:
                total += (hi - lo) / (end - first) * (n - 1)
    return total


def steady_state(out_dir, gpus, batch):
    """(W per GPU, output tokens/s) over the benchmark's steady-state window."""
    requests = [r for r in csv.DictReader(open(os.path.join(out_dir, "requests.csv")))
                if r["status"] == "done"]
    firsts = sorted(float(r["first_token_s"]) for r in requests)
    t0, t1 = firsts[batch - 1], firsts[len(firsts) - batch - 1]
    summary = json.load(open(os.path.join(out_dir, "summary.json")))
    idle_w = summary["energy_parts_j"]["xpu_idle"] / (gpus * summary["makespan_s"])
    energy = span = 0.0
    for it in csv.DictReader(open(os.path.join(out_dir, "iterations.csv"))):
        start = float(it["start_s"])
        if t0 <= start < t1:
            energy += float(it["energy_j"])
            span += float(it["duration_s"])
    return idle_w + energy / (gpus * span), tokens_in(requests, t0, t1) / span


def run(servesim, out, key, batch, lin, lout):
    d = os.path.join(out, f"{key}_{batch}")
    os.makedirs(out, exist_ok=True)
    # The scenario beside its output folder: servesim writes no outputs
    # where its inputs lie.
    path = d + ".pbtxt"
    with open(path, "w") as f:
        f.write(scenario(key, batch, lin, lout))
    subprocess.run([servesim, "run", path, "--out", d, "--quiet"], check=True)
    return steady_state(d, MEASURED[key][0], batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="8b,70b,405b")
    ap.add_argument("--input", type=int, default=634)
    ap.add_argument("--output", type=int, default=717)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "ml_energy"))
    ap.add_argument("--servesim", default=os.path.join(ROOT, "build", "services", "servesim"))
    args = ap.parse_args()
    points = [(k, b) for k in args.models.split(",") for b in MEASURED[k][3]]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(
            lambda p: run(args.servesim, args.out, p[0], p[1], args.input, args.output), points))
    print("model  GPUs  batch | W/GPU servesim measured   err | tok/s servesim measured   err |"
          " J/token servesim measured   err")
    errs = {}
    for (key, batch), (watts, tps) in zip(points, results):
        gpus = MEASURED[key][0]
        mw, mt = MEASURED[key][3][batch]
        j, mj = watts * gpus / tps, mw * gpus / mt
        errs.setdefault(key, []).append(j / mj - 1)
        print(f"{key:>5} {gpus:>5} {batch:>6} | {watts:14.0f} {mw:8d} {100 * (watts / mw - 1):+5.1f}%"
              f" | {tps:14.0f} {mt:8d} {100 * (tps / mt - 1):+5.1f}%"
              f" | {j:16.3f} {mj:8.3f} {100 * (j / mj - 1):+5.1f}%")
    for key, e in errs.items():
        print(f"{key}: J/token error {100 * min(e):+.1f}% to {100 * max(e):+.1f}%"
              f"{'  (calibration set)' if key == '8b' else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
