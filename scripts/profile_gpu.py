#!/usr/bin/env python3
"""Measures a GPU profile bundle (docs/profiles.md) with PyTorch on the GPU at hand.

servesim costs a step from a bundle of measured per-operator times of one decoder layer
(dense.csv, attention.csv, per_sequence.csv, meta.yaml), in the layout LLMServingSim's
profiler writes. That profiler needs vLLM; this script needs only PyTorch (2.5 or newer, CUDA),
so that a bundle can be made for any GPU and model shape servesim knows:

    python3 scripts/profile_gpu.py --gpu H100 --out profiles/ \
        --model llama3.1-8b:1,2 --model codellama-34b:1

What is measured, and how it differs from vLLM's own kernels (docs/profiles.md has the page):
  - GEMMs (qkv_proj, o_proj, gate_up_proj, down_proj, lm_head): torch.nn.functional.linear in
    bf16, i.e. cuBLAS, which is what vLLM runs for unquantised bf16 weights. Each call reads a
    different copy of the weight, so that a small weight is not served from L2 as it never is
    in a model with many layers.
  - Attention: FlashAttention-2 varlen (torch.ops.aten._flash_attention_forward) over one
    prefill chunk attending to its cached history plus n decodes, each query attending to its
    own keys, causal (bottom-right), the KV read from contiguous memory rather than vLLM's
    16-token pages. vLLM on Hopper may run FlashAttention-3 instead: prefill is then faster.
  - Elementwise layers (layernorm, rotary_emb, qk_norm, act_fn, final_layernorm): one kernel
    moving the same bytes as vLLM's fused kernel (vLLM fuses each into one; PyTorch has no such
    single kernel for all of them), so their time is a memory-traffic proxy.
  - embedding: torch.embedding; sampler: logits to fp32 and argmax (greedy, as the replayed
    runs sample).
Times are GPU time per call: calls are queued behind a sleeping kernel so that launch gaps do
not count (as under CUDA graphs), and the figure is the median of three timed bursts.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
except ImportError:  # --despike needs no GPU
    torch = None

# Model shapes: the public config.json of each model (the same figures as servesim's presets,
# devices/presets.cc). name: (hf_name, d_model, heads, kv_heads, d_head, d_ff, vocab, qk_norm)
MODELS = {
    "llama2-7b": ("meta-llama/Llama-2-7b-hf", 4096, 32, 32, 128, 11008, 32000, False),
    "llama2-13b": ("meta-llama/Llama-2-13b-hf", 5120, 40, 40, 128, 13824, 32000, False),
    "llama3.1-8b": ("meta-llama/Llama-3.1-8B", 4096, 32, 8, 128, 14336, 128256, False),
    "llama3.1-70b": ("meta-llama/Llama-3.1-70B", 8192, 64, 8, 128, 28672, 128256, False),
    "llama3.2-1b": ("meta-llama/Llama-3.2-1B", 2048, 32, 8, 64, 8192, 128256, False),
    "llama3.2-3b": ("meta-llama/Llama-3.2-3B", 3072, 24, 8, 128, 8192, 128256, False),
    "qwen3-8b": ("Qwen/Qwen3-8B", 4096, 32, 8, 128, 12288, 151936, True),
    "qwen3-14b": ("Qwen/Qwen3-14B", 5120, 40, 8, 128, 17408, 151936, True),
    "qwen3-32b": ("Qwen/Qwen3-32B", 5120, 64, 8, 128, 25600, 151936, True),
    "codellama-34b": ("codellama/CodeLlama-34b-Instruct-hf", 8192, 64, 8, 128, 22016, 32000, False),
    "mistral-7b": ("mistralai/Mistral-7B-v0.3", 4096, 32, 8, 128, 14336, 32768, False),
}

DT = torch.bfloat16 if torch else None
DEV = "cuda"
L2_FLUSH_BYTES = 256 << 20  # rotate weight copies until a burst touches this much memory


def token_grid(max_tokens):
    """The dense grid of LLMServingSim's profiler (1-16, every 4 to 64, every 16 to 2,048),
    continued every 256 tokens up to max_tokens."""
    g = list(range(1, 17)) + list(range(20, 65, 4)) + list(range(80, 2049, 16))
    g += list(range(2304, max_tokens + 1, 256))
    return [t for t in g if t <= max_tokens]


def seq_grid(max_seqs):
    g = list(range(1, 17)) + list(range(20, 65, 4)) + list(range(80, 1025, 16))
    return [s for s in g if s <= max_seqs]


class Timer:
    """GPU time per call of fn(i), i = 0..n-1. Each timed burst is queued behind a sleeping
    kernel long enough for Python to enqueue the whole burst, so the GPU runs the calls back to
    back and launch gaps do not count (as under CUDA graphs)."""

    LAUNCH_US = 100  # generous: Python's dispatch of one call is 10-50 us

    def __init__(self):
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # load the kernel before timing it
        torch.cuda.synchronize()
        self.start.record()
        torch.cuda._sleep(50_000_000)
        self.end.record()
        torch.cuda.synchronize()
        self.cycles_per_us = 50_000_000 / max(1.0, self.start.elapsed_time(self.end) * 1000)

    def burst(self, fn, n):
        torch.cuda._sleep(int(n * self.LAUNCH_US * self.cycles_per_us))
        self.start.record()
        for i in range(n):
            fn(i)
        self.end.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.end) * 1000 / n

    def __call__(self, fn, n=10, trials=3):
        fn(0)  # first call of a shape: library heuristics, lazy set-up
        torch.cuda.synchronize()
        if self.burst(fn, 2) > 300:  # long calls: a few suffice
            n, trials = 3, 2
        return statistics.median(self.burst(fn, n) for _ in range(trials))


def copies_for(nbytes, n):
    return max(1, min(n, math.ceil(L2_FLUSH_BYTES / max(1, nbytes))))


def gemm_curve(timer, tokens, k, n_out, log):
    """time_us of x[t, k] @ W[k, n_out] for t in tokens, W rotated over copies."""
    w_bytes = k * n_out * 2
    ws = [torch.randn(n_out, k, device=DEV, dtype=DT) * 0.02 for _ in range(copies_for(w_bytes, 10))]
    x_all = torch.randn(max(tokens), k, device=DEV, dtype=DT)
    rows = []
    for t in tokens:
        x = x_all[:t]
        rows.append((t, timer(lambda i: torch.nn.functional.linear(x, ws[i % len(ws)]))))
    del ws, x_all
    return rows


def elementwise_curve(timer, tokens, width, reads, writes):
    """One kernel reading `reads` and writing `writes` rows of `width` bf16 per token: a
    multiply by a weight vector, in place when writes == 0."""
    rows = []
    w = torch.randn(width, device=DEV, dtype=DT)
    one = torch.ones(width, device=DEV, dtype=DT)
    for t in tokens:
        a = torch.randn(reads, t, width, device=DEV, dtype=DT)
        if reads == 2 and writes == 2:  # fused add + RMSNorm: x, residual in; both out
            o = torch.empty_like(a)
            fn = lambda i: torch.mul(a, w, out=o)
        elif reads == 2 and writes == 1:  # silu_and_mul: gate, up in; one out
            o = torch.empty(t, width, device=DEV, dtype=DT)
            fn = lambda i: torch.mul(a[0], a[1], out=o)
        elif writes == 0:  # in place on q and k (rotary, q/k norm); by one, to stay finite
            fn = lambda i: a[0].mul_(one)
        else:  # a plain RMSNorm: x in, x out
            o = torch.empty(t, width, device=DEV, dtype=DT)
            fn = lambda i: torch.mul(a[0], w, out=o)
        rows.append((t, timer(fn)))
    return rows


def dense_rows(timer, spec, tp, max_tokens, log):
    hf, d, h, hkv, dh, ff, vocab, qk_norm = spec
    if h % tp or ff % tp or (hkv >= tp and hkv % tp) or (hkv < tp and tp % hkv):
        raise ValueError(f"{hf}: TP{tp} does not divide heads {h}/{hkv} or d_ff {ff}")
    hq, hk = h // tp, max(1, hkv // tp)
    toks = token_grid(max_tokens)
    out = []
    t0 = time.time()
    for name, k, n in (("qkv_proj", d, (hq + 2 * hk) * dh), ("o_proj", hq * dh, d),
                       ("gate_up_proj", d, 2 * ff // tp), ("down_proj", ff // tp, d)):
        out += [(name, t, us) for t, us in gemm_curve(timer, toks, k, n, log)]
    out += [("rotary_emb", t, us) for t, us in elementwise_curve(timer, toks, (hq + hk) * dh, 1, 0)]
    if qk_norm:
        out += [("qk_norm", t, us) for t, us in elementwise_curve(timer, toks, (hq + hk) * dh, 1, 0)]
    out += [("act_fn", t, us) for t, us in elementwise_curve(timer, toks, ff // tp, 2, 1)]
    out += [("layernorm", t, us) for t, us in elementwise_curve(timer, toks, d, 2, 2)]
    out += [("final_layernorm", t, us) for t, us in elementwise_curve(timer, toks, d, 1, 1)]
    table = torch.randn(vocab // tp, d, device=DEV, dtype=DT)
    ids_all = torch.randint(0, vocab // tp, (max(toks),), device=DEV)
    for t in toks:
        ids = ids_all[:t]
        out.append(("embedding", t, timer(lambda i: torch.embedding(table, ids))))
    del table
    log(f"    dense: {len(out)} points in {time.time() - t0:.1f} s")
    return out


def per_sequence_rows(timer, spec, tp, max_seqs):
    hf, d, h, hkv, dh, ff, vocab, qk_norm = spec
    seqs = seq_grid(max_seqs)
    rows = [("lm_head", s, us) for s, us in gemm_curve(timer, seqs, d, vocab // tp, None)]
    logits_all = torch.randn(max(seqs), vocab, device=DEV, dtype=DT)
    for s in seqs:
        lg = logits_all[:s]
        rows.append(("sampler", s, timer(lambda i: torch.argmax(lg.float(), dim=-1))))
    return rows


def attention_grid(full):
    """(prefill_chunk, kv_prefill, n_decode, kv_decode) rows, ascending."""
    x2 = lambda lo, hi: [lo << i for i in range(0, 20) if (lo << i) <= hi]
    kv = x2(16, 16384)
    rows = []
    for nd in x2(1, 256):  # pure decode: the x2 grid in full
        for kvd in kv:
            rows.append((0, 0, nd, kvd))
    chunks = x2(16, 4096)
    kvp_axis = [0] + (kv if full else x2(16, 16384)[::2])
    nd_axis = [0] + (x2(1, 256) if full else [1, 4, 16, 64, 256])
    kvd_axis = kv if full else kv[::2] + ([kv[-1]] if kv[-1] not in kv[::2] else [])
    for c in chunks:
        for kvp in kvp_axis:
            for nd in nd_axis:
                for kvd in ([0] if nd == 0 else kvd_axis):
                    rows.append((c, kvp, nd, kvd))
    return sorted(set(rows))


CAUSAL = True  # bottom-right aligned in FlashAttention >= 2.1; check_attention confirms


def check_attention(log):
    """The varlen kernel against a by-hand softmax for one chunk of 3 queries over 7 keys with
    GQA (4 query heads, 2 KV heads): bottom-right causal alignment (query i sees keys up to
    i + 4) is what a chunk with cached history needs. Falls back to non-causal otherwise."""
    global CAUSAL
    g = torch.Generator(device=DEV).manual_seed(0)
    hq, hk, dh, nq, nk = 4, 2, 64, 3, 7
    q = torch.randn(nq, hq, dh, device=DEV, dtype=DT, generator=g)
    k = torch.randn(nk, hk, dh, device=DEV, dtype=DT, generator=g)
    v = torch.randn(nk, hk, dh, device=DEV, dtype=DT, generator=g)
    cu_q = torch.tensor([0, nq], device=DEV, dtype=torch.int32)
    cu_k = torch.tensor([0, nk], device=DEV, dtype=torch.int32)
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, nq, nk, 0.0, True, False)[0]
    kk = k.float().repeat_interleave(hq // hk, dim=1)
    vv = v.float().repeat_interleave(hq // hk, dim=1)
    sc = torch.einsum("qhd,khd->hqk", q.float(), kk) / math.sqrt(dh)
    i = torch.arange(nq, device=DEV)[:, None]
    j = torch.arange(nk, device=DEV)[None, :]
    diffs = {}
    for name, mask in (("bottom-right", j > i + (nk - nq)), ("top-left", j > i)):
        ref = torch.einsum("hqk,khd->qhd", torch.softmax(sc.masked_fill(mask, float("-inf")), -1), vv)
        diffs[name] = (out.float() - ref).abs().max().item()
    log(f"flash varlen self-check (max |diff|): {diffs}")
    if diffs["bottom-right"] > 3e-2:
        CAUSAL = False
        log("WARNING: causal is not bottom-right aligned; timing attention non-causal")


class Attention:
    def __init__(self, hq, hk, dh, pool_tokens):
        self.hq, self.hk, self.dh = hq, hk, dh
        self.k = torch.randn(pool_tokens, hk, dh, device=DEV, dtype=DT)
        self.v = torch.randn(pool_tokens, hk, dh, device=DEV, dtype=DT)
        self.q = torch.randn(4096 + 256, hq, dh, device=DEV, dtype=DT)
        self.pool = pool_tokens
        self.stride = max(1, (64 << 20) // (hk * dh * 2))  # tokens in 64 MB: a new region per call

    def run(self, timer, c, kvp, nd, kvd):
        q_lens = ([c] if c else []) + [1] * nd
        k_lens = ([kvp + c] if c else []) + [kvd + 1] * nd
        tq, tk = sum(q_lens), sum(k_lens)
        if tk > self.pool:
            return None
        cu_q = torch.tensor([0] + list(_cumsum(q_lens)), device=DEV, dtype=torch.int32)
        cu_k = torch.tensor([0] + list(_cumsum(k_lens)), device=DEV, dtype=torch.int32)
        q = self.q[:tq]
        span = self.pool - tk
        mq, mk = max(q_lens), max(k_lens)

        def fn(i):
            off = (i * self.stride) % (span + 1) if span > 0 else 0
            torch.ops.aten._flash_attention_forward(
                q, self.k[off:off + tk], self.v[off:off + tk], cu_q, cu_k, mq, mk, 0.0, CAUSAL, False)

        return timer(fn, n=6 if tk > 1 << 20 else 10)


def _cumsum(xs):
    s = 0
    for x in xs:
        s += x
        yield s


def despike(rows, ncoords, axes=None):
    """Replaces spikes: a point more than 1.5x (+5 us) slower than the next larger shape along
    one axis (all other coordinates equal), which a kernel that only does more work there
    cannot be. Such points come from the machine (an interrupt, a clock dip, often a few in a
    row), not the kernel. Each axis is walked from its largest value down, so that a point is
    compared with an already clean neighbour, and a spike takes that neighbour's time (an upper
    bound for the smaller shape). Returns the rows and how many were replaced."""
    t = {r[:ncoords]: r[ncoords] for r in rows}
    replaced = set()
    for axis in list(range(ncoords) if axes is None else axes) * 2:  # twice: spikes on two axes
        lines = {}
        for key in t:
            lines.setdefault(key[:axis] + key[axis + 1:], []).append(key[axis])
        for rest, xs in lines.items():
            xs.sort()
            at = lambda x: rest[:axis] + (x,) + rest[axis:]
            for i in range(len(xs) - 2, -1, -1):
                cur, nxt = at(xs[i]), at(xs[i + 1])
                if t[cur] > 1.5 * t[nxt] + 5:
                    t[cur] = t[nxt]
                    replaced.add(cur)
    return [k + (t[k],) for k in sorted(t)], len(replaced)


def despike_tree(root):
    for variant_dir, dirs, files in sorted(os.walk(root)):
        tps = sorted(d for d in dirs if d.startswith("tp"))
        if "meta.yaml" not in files or not tps:
            continue
        counts = {}
        for tp in tps:
            for name, header, ncoords, axes, fmt in (
                    ("dense.csv", "layer,tokens,time_us", 2, [1], "%s,%d,%.3f"),
                    ("per_sequence.csv", "layer,sequences,time_us", 2, [1], "%s,%d,%.3f"),
                    ("attention.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us", 4,
                     None, "%d,%d,%d,%d,%.3f")):
                path = os.path.join(variant_dir, tp, name)
                with open(path) as f:
                    lines = f.read().split("\n")[1:]
                rows = []
                for line in filter(None, lines):
                    v = line.split(",")
                    key = tuple(int(x) for x in v[:ncoords]) if ncoords == 4 else (v[0], int(v[1]))
                    rows.append(key + (float(v[-1]),))
                rows, n = despike(rows, ncoords, axes)
                write_csv(path, header, rows, fmt)
                counts[name[:-4]] = counts.get(name[:-4], 0) + n
        with open(os.path.join(variant_dir, "meta.yaml")) as f:
            meta = [l for l in f.read().split("\n") if l]
        cut = next((i for i, l in enumerate(meta) if l.startswith("despiked_points:")), None)
        if cut is not None:  # an earlier pass's counts: add to them
            end = cut + 1
            while end < len(meta) and meta[end].startswith("  "):
                k, _, v = meta[end].strip().partition(":")
                counts[k] = counts.get(k, 0) + int(v)
                end += 1
            del meta[cut:end]
        meta.append("despiked_points:")
        meta += [f"  {k}: {v}" for k, v in counts.items()]
        with open(os.path.join(variant_dir, "meta.yaml"), "w") as f:
            f.write("\n".join(meta) + "\n")
        print(f"{variant_dir}: despiked {counts}")


def write_csv(path, header, rows, fmt):
    with open(path, "w") as f:
        f.write(header + "\n")
        for r in rows:
            f.write(fmt % r + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--despike", metavar="DIR",
                    help="only despike the bundles already under DIR (what a measuring run does "
                         "before writing), and record the counts in their meta.yaml")
    ap.add_argument("--gpu", help="the bundle's GPU folder name (servesim presets xpus: profile_name)")
    ap.add_argument("--out", help="the search root to write <gpu>/<org>/<model>/bf16/tp<N>/ under")
    ap.add_argument("--model", action="append",
                    help="PRESET:TP[,TP...] (presets: %s)" % ", ".join(sorted(MODELS)))
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--max-seqs", type=int, default=512)
    ap.add_argument("--full-attention-grid", action="store_true",
                    help="every x2 point on every attention axis (about 5x the points)")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting new bundles after this")
    args = ap.parse_args()
    if args.despike:
        return despike_tree(args.despike)
    if not (args.gpu and args.out and args.model):
        ap.error("--gpu, --out and --model are needed to measure")
    if torch is None or not torch.cuda.is_available():
        sys.exit("profile_gpu: measuring needs PyTorch with a CUDA GPU")

    t_start = time.time()
    log = lambda m: print(f"[{time.time() - t_start:7.1f}s] {m}", flush=True)
    props = torch.cuda.get_device_properties(0)
    log(f"torch {torch.__version__}, {props.name}, {props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.1f} GiB")
    timer = Timer()
    log(f"sleep kernel: {timer.cycles_per_us:.0f} cycles/us")

    # Peaks, for the record: a large bf16 GEMM and a device-to-device copy.
    a = torch.randn(8192, 8192, device=DEV, dtype=DT)
    us = timer(lambda i: a @ a, n=10)
    peak = {"gemm_8192_tflops": 2 * 8192**3 / us / 1e6}
    buf = torch.empty(2 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(buf)
    us = timer(lambda i: dst.copy_(buf), n=5)
    peak["copy_rw_tb_s"] = 2 * buf.numel() / us / 1e6
    del a, buf, dst
    log(f"peaks: {peak}")
    check_attention(log)

    jobs = []
    for m in args.model:
        name, _, tps = m.partition(":")
        if name not in MODELS:
            sys.exit(f"--model {m}: unknown preset {name} (known: {', '.join(sorted(MODELS))})")
        for tp in (tps or "1").split(","):
            jobs.append((name, int(tp)))

    att_cache = {}
    for name, tp in jobs:
        if args.budget_s and time.time() - t_start > args.budget_s:
            log(f"budget spent: skipping {name} TP{tp}")
            continue
        spec = MODELS[name]
        hf, d, h, hkv, dh, ff, vocab, qk_norm = spec
        hq, hk = h // tp, max(1, hkv // tp)
        variant_dir = os.path.join(args.out, args.gpu, hf, "bf16")
        tp_dir = os.path.join(variant_dir, f"tp{tp}")
        os.makedirs(tp_dir, exist_ok=True)
        log(f"{hf} TP{tp}: heads {hq}/{hk} x {dh}")
        try:
            dense, n_dense = despike(dense_rows(timer, spec, tp, args.max_tokens, log), 2, [1])
            write_csv(os.path.join(tp_dir, "dense.csv"), "layer,tokens,time_us", dense, "%s,%d,%.3f")
            per, n_per = despike(per_sequence_rows(timer, spec, tp, args.max_seqs), 2, [1])
            write_csv(os.path.join(tp_dir, "per_sequence.csv"), "layer,sequences,time_us", per,
                      "%s,%d,%.3f")
            key = (hq, hk, dh)
            if key not in att_cache:
                t0 = time.time()
                torch.cuda.empty_cache()
                free = torch.cuda.mem_get_info()[0]
                pool = int(min(free * 0.8 / 2, 24 << 30) // (hk * dh * 2))  # K and V pools
                att = Attention(hq, hk, dh, pool)
                rows = []
                for c, kvp, nd, kvd in attention_grid(args.full_attention_grid):
                    us = att.run(timer, c, kvp, nd, kvd)
                    if us is not None:
                        rows.append((c, kvp, nd, kvd, us))
                del att
                torch.cuda.empty_cache()
                att_cache[key] = despike(rows, 4)
                log(f"    attention {key}: {len(rows)} points in {time.time() - t0:.1f} s")
            write_csv(os.path.join(tp_dir, "attention.csv"),
                      "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us", att_cache[key][0],
                      "%d,%d,%d,%d,%.3f")
        except Exception as e:  # keep what other bundles measured
            log(f"    FAILED: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
            continue
        with open(os.path.join(variant_dir, "meta.yaml"), "w") as f:
            f.write(f"profiler: servesim scripts/profile_gpu.py (PyTorch kernels, not vLLM's)\n")
            f.write(f"torch_version: {torch.__version__}\n")
            f.write(f"cuda_version: '{torch.version.cuda}'\n")
            f.write(f"gpu: {props.name}\n")
            f.write(f"hardware: {args.gpu}\n")
            f.write(f"profiled_at: '{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}'\n")
            f.write(f"model: {hf}\nvariant: bf16\n")
            f.write(f"peak_gemm_8192_tflops: {peak['gemm_8192_tflops']:.1f}\n")
            f.write(f"peak_copy_rw_tb_s: {peak['copy_rw_tb_s']:.3f}\n")
            f.write(f"attention_kernel: FlashAttention-2 varlen (torch aten), contiguous KV, causal {CAUSAL}\n")
            f.write(f"despiked_points:\n  dense: {n_dense}\n  per_sequence: {n_per}\n"
                    f"  attention: {att_cache[key][1]}\n")
            f.write("skew_fit:\n  enabled: false\n")
    log("done")


if __name__ == "__main__":
    main()
