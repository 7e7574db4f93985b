#!/usr/bin/env bash
# Regenerates the seed corpora in tests/fuzz/corpus/ from the repository's
# own inputs (run from anywhere; needs protoc and python3):
#  - scenario_fuzz: every examples/**/*.pbtxt, plus two with `#set` lines
#  - trace_*_fuzz: the first 50 lines of each shipped trace (examples/traces/)
#  - npy_fuzz: small fp16 / fp32 .npy files, versions 1.0 and 2.0
#  - agent_fuzz: the requests in tests/fuzz/seeds/*.txtpb (an iteration of
#    GPT-3 175B and of Llama-2 7B, Describe) and two ExecuteRequests, each
#    encoded once per device kind (byte 0) and method (byte 1).
#  - inference_perf_fuzz: the shipped inference-perf configs and a one-line
#    JSON config.
# Inputs the fuzzers found and that were fixed (regression inputs) live in
# the same folders under names starting with `regression-`; they are kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=tests/fuzz/corpus
for d in scenario_fuzz trace_azure_fuzz trace_mooncake_fuzz trace_burstgpt_fuzz \
         trace_length_csv_fuzz trace_plain_csv_fuzz trace_token_ids_fuzz npy_fuzz agent_fuzz \
         inference_perf_fuzz; do
  mkdir -p "$out/$d"
  find "$out/$d" -type f ! -name 'regression-*' -delete
done

for f in examples/*.pbtxt examples/*/*.pbtxt; do
  cp "$f" "$out/scenario_fuzz/$(basename "$f")"
done
{ cat examples/llama2_7b_poisson_sharegpt.pbtxt
  printf '#set cluster.replicas=3\n#set workload.poisson.rate_rps=4.5\n#set scheduler.batching=CHUNKED_PREFILL\n'
} >"$out/scenario_fuzz/set_overrides.pbtxt"
{ cat examples/attacc/gpt3_175b_dgx_attacc_saturated.pbtxt
  printf '#set seed=7\n#set cluster.tensor_parallel=4\n'
} >"$out/scenario_fuzz/set_attacc.pbtxt"

head -50 examples/traces/AzureLLMInferenceTrace_conv.csv >"$out/trace_azure_fuzz/conv_head50.csv"
head -50 examples/traces/AzureLLMInferenceTrace_code.csv >"$out/trace_azure_fuzz/code_head50.csv"
# Mooncake lines carry long hash_ids lists: the first 8 ids of each are kept.
head -50 examples/traces/synthetic_trace.jsonl | sed -E 's/("hash_ids": \[([0-9]+, ){7}[0-9]+)[^]]*\]/\1]/' \
  >"$out/trace_mooncake_fuzz/synthetic_head50.jsonl"
head -50 examples/traces/burstgpt_slice.csv >"$out/trace_burstgpt_fuzz/slice_head50.csv"
head -50 examples/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv \
  >"$out/trace_length_csv_fuzz/sharegpt_head50.csv"
head -50 examples/vllm/runs/RTXPRO6000_Llama-3.1-8B_tp1/trace.csv >"$out/trace_plain_csv_fuzz/vllm_head50.csv"
printf 'arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n0,100,5,a,40\n0.5,64,3,a,64\n1.25,30,2,b,0\n' \
  >"$out/trace_plain_csv_fuzz/prefix_groups.csv"
# Token-id lines: the first 5 requests, each prompt cut to its first 64 ids.
zcat examples/vllm/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz | head -5 | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    ids = r["input_tok_ids"][:64]
    print(json.dumps({"input_toks": len(ids), "output_toks": r["output_toks"],
                      "arrival_time_ns": r["arrival_time_ns"], "input_tok_ids": ids}))
' >"$out/trace_token_ids_fuzz/sharegpt_head5.jsonl"

python3 - "$out" <<'PY'
import os, random, struct, subprocess, sys
out = sys.argv[1]
rng = random.Random(9)

def npy(shape, descr, version=1):
    shape_text = "(" + "".join(f"{d}, " for d in shape).rstrip(" ") + ")"
    if len(shape) > 1:
        shape_text = shape_text.replace(", )", ")")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    pre = 10 if version == 1 else 12
    header += " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    n = 1
    for d in shape:
        n *= d
    fmt = "e" if descr == "<f2" else "f"
    body = struct.pack("<%d%s" % (n, fmt), *[rng.uniform(-2, 2) for _ in range(n)])
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + body

for name, data in {
    "q_fp16_4x8.npy": npy((4, 8), "<f2"),
    "k_fp32_6x4.npy": npy((6, 4), "<f4"),
    "v_fp16_v2_3x2x4.npy": npy((3, 2, 4), "<f2", version=2),
    "scalar_fp32.npy": npy((), "<f4"),
    "vector_fp16.npy": npy((5,), "<f2"),
}.items():
    with open(os.path.join(out, "npy_fuzz", name), "wb") as f:
        f.write(data)

def encode(message, text):
    return subprocess.run(
        ["protoc", "-Iproto", "--encode=servesim.v1." + message, "proto/servesim/v1/agent.proto"],
        input=text.encode(), stdout=subprocess.PIPE, check=True).stdout

def tensor_text(shape, fp16=True):
    n = 1
    for d in shape:
        n *= d
    data = struct.pack("<%d%s" % (n, "e" if fp16 else "f"), *[rng.uniform(-1, 1) for _ in range(n)])
    esc = "".join("\\%03o" % b for b in data)
    return "type: %s %s data: \"%s\"" % ("ELEMENT_TYPE_FP16" if fp16 else "ELEMENT_TYPE_FP32",
                                         " ".join("shape: %d" % d for d in shape), esc)

requests = []  # (method, name, bytes)
seeds = "tests/fuzz/seeds"
for f in sorted(os.listdir(seeds)):
    text = open(os.path.join(seeds, f)).read()
    if f.startswith("estimate"):
        requests.append((1, f[:-7], encode("EstimateRequest", text)))
    elif f.startswith("describe"):
        requests.append((0, f[:-7], encode("DescribeRequest", text)))
# Decode attention: 4 query heads over 2 KV heads (GQA), d_head 8, 16 cached
# positions; and 2 heads, 3 queries (a prefill chunk) over 5 positions, fp32.
requests.append((2, "execute_gqa_decode", encode("ExecuteRequest",
    "q { %s } k { %s } v { %s }" % (tensor_text((4, 1, 8)), tensor_text((2, 16, 8)),
                                    tensor_text((2, 16, 8))))))
requests.append((2, "execute_prefill_fp32", encode("ExecuteRequest",
    "q { %s } k { %s } v { %s } scale: 0.25" % (tensor_text((2, 3, 4), False),
        tensor_text((2, 5, 4), False), tensor_text((2, 5, 4), False)))))
kinds = ["gpu", "attacc", "topick", "spatten", "lad", "cta"]
for k, kind in enumerate(kinds):
    for method, name, data in requests:
        with open(os.path.join(out, "agent_fuzz", "%s_%s" % (kind, name)), "wb") as f:
            f.write(bytes([k, method]) + data)
PY
# inference_perf_fuzz: the shipped configs (block YAML, flow items) and the
# one-line JSON form some run bundles record.
cp examples/vllm/inference_perf/*/config.yaml "$out/inference_perf_fuzz/kubecon_sweep.yaml"
cp tests/testdata/replay/inference_perf_run/config.yml "$out/inference_perf_fuzz/two_stages.yml"
printf '%s\n' '{"load": {"type": "poisson", "stages": [{"rate": 2, "duration": 5}]}, "data": {"type": "random", "input_distribution": {"min": 1, "max": 300, "mean": 100, "std_dev": 40, "total_count": 50}, "output_distribution": {"type": "lognormal", "min": 1, "max": 90, "mean": 30, "std_dev": 10, "total_count": 20}}}' \
  >"$out/inference_perf_fuzz/one_line_json.yaml"
du -sh "$out"; for d in "$out"/*; do echo "$d: $(ls "$d" | wc -l) files"; done
