#!/usr/bin/env bash
# Disaggregated serving, two ways (docs/disaggregation.md):
#  1. the study: Llama-3.1-70B on 16 H100s (two DGX H100 nodes, TP4
#     replicas) colocated (4 replicas), disaggregated (2 prefill + 2 decode,
#     3 + 1) and disaggregated with AttAcc beside the decode replicas, on the
#     Azure conversation trace at RATES (default "2 4") times its rate and on
#     the Mooncake synthetic trace at a quarter of its rate, under
#     TTFT <= 2 s and TPOT <= 50 ms; on Mooncake also KV-cache-centric:
#     host-DRAM tiers and a cluster store with prefix-aware routing,
#     colocated and in the prefill pool of a 3 + 1 split;
#  2. the plots (docs/img/disaggregation_*.svg): goodput against the arrival
#     rate for the study's configurations, the Azure conversation trace at
#     x1 to x6 its rate and the Mooncake trace at x0.125 to x0.5, under the
#     same SLOs; each plot's table beside it (.csv);
#  3. the speed table: N_NODES (default "16 32 64") DGX H100 nodes, half
#     prefill and half decode (TP4 replicas), over the Azure conversation
#     hour at N/2 times its rate (the trace sped up N/2 times and replayed
#     N/2 times: an hour), pinned to one core; cost per request and per step
#     should stay flat as nodes and requests grow.
# Usage: bench/disaggregation.sh [study|plot|speed]    (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SERVESIM_BIN:-build/services/servesim}
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
what=${1:-all}
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scenario=examples/llama3.1_70b_pd_2xdgx_h100_azure_conv.pbtxt
quiet=(--set output.iterations_csv=false --set output.timeline=false
       --set output.report_html=false --set output.requests_csv=false)
traces=$PWD/examples/traces

run() {  # name, then servesim run arguments
  local name=$1; shift
  /usr/bin/time -f "%M" -o "$tmp/$name.rss" "${pin[@]}" "$bin" run "$@" --quiet \
    --out "$tmp/$name" "${quiet[@]}"
}

row() {  # name, label
  python3 - "$tmp/$1" "$2" "$(cat "$tmp/$1.rss")" <<'PY'
import json, sys
d, label, rss = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(f"{d}/summary.json"))
info = json.load(open(f"{d}/run_info.json"))
share = s.get("ttft_kv_transfer_share")
print(f"{label:<40} {s['throughput_tokens_per_s']:>9.0f} {s['goodput_requests_per_s']:>8.2f} "
      f"{100 * s['slo_attainment']:>6.1f}% {s['ttft_s']['p50'] * 1e3:>8.0f} {s['ttft_s']['p99'] * 1e3:>8.0f} "
      f"{s['tpot_s']['p99'] * 1e3:>7.1f} {'-' if share is None else f'{100 * share:.1f}%':>7} "
      f"{s['energy_per_token_j']:>6.3f} {s['simulated_time_s'] / info['wall_time_s']:>7.0f}x")
PY
}

if [ "$what" = all ] || [ "$what" = study ]; then
  echo "study: Llama-3.1-70B, 16 x H100 (2 x DGX H100), TP4 replicas; SLO TTFT <= 2 s, TPOT <= 50 ms"
  printf '%-40s %9s %8s %7s %8s %8s %7s %7s %6s %8s\n' configuration "tok/s" "goodput" "SLO" \
    "TTFT50" "TTFT99" "TPOT99" "xfer" "J/tok" speed
  for load in ${RATES:-2 4} mooncake; do
    if [ "$load" = mooncake ]; then
      wl=(--set workload.trace.path="$traces/synthetic_trace.jsonl" --set workload.rate_scale=0.25)
      tag="Mooncake x0.25"
    else
      wl=(--set workload.trace.path="$traces/AzureLLMInferenceTrace_conv.csv"
          --set workload.rate_scale="$load")
      tag="Azure conv x$load"
    fi
    slo=(--set slo.ttft_s=2 --set slo.tpot_s=0.05)
    # Colocated: the same 16 GPUs as 4 replicas of one pool-less cluster.
    sed -e '/disaggregation {/,/^  }/d' -e 's/tensor_parallel: 4/tensor_parallel: 4\n  replicas: 4/' \
      "$scenario" > "$tmp/colocated.pbtxt"
    run col "$tmp/colocated.pbtxt" "${wl[@]}" "${slo[@]}"
    row col "$tag: colocated 4 x TP4"
    for split in "2 2" "3 1"; do
      set -- $split
      pools=(--set cluster.disaggregation.prefill.cluster.replicas=$1
             --set cluster.disaggregation.decode.cluster.replicas=$2)
      run pd "$scenario" "${wl[@]}" "${slo[@]}" "${pools[@]}"
      row pd "$tag: P/D $1 + $2 x TP4"
      run pda "$scenario" "${wl[@]}" "${slo[@]}" "${pools[@]}" \
        --set cluster.disaggregation.decode.cluster.attacc.preset=attacc_bank
      row pda "$tag: P/D $1 + $2 x (TP4 + AttAcc)"
    done
    if [ "$load" = mooncake ]; then
      # KV-cache-centric (Mooncake): each GPU's host keeps 200 GB of KV in
      # DRAM and gives 50 GB to a store its pool shares over the NICs, and
      # requests go to the replica caching most of their prompt.
      tiers='kv_tiers { tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 200e9 link { preset: "pcie5" } } tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 50e9 link { preset: "infiniband-ndr" } } }'
      sed -e "s|replicas: 4|replicas: 4\n  $tiers|" \
        -e 's/BATCHING_POLICY_VLLM_V1 }/BATCHING_POLICY_VLLM_V1 routing: ROUTING_POLICY_PREFIX_AFFINITY }/' \
        "$tmp/colocated.pbtxt" > "$tmp/colocated_store.pbtxt"
      run cols "$tmp/colocated_store.pbtxt" "${wl[@]}" "${slo[@]}"
      row cols "$tag: colocated 4 x TP4, DRAM + store"
      sed -e "s|prefill { cluster { replicas: 2 } }|prefill { cluster { replicas: 3 $tiers } scheduler { routing: ROUTING_POLICY_PREFIX_AFFINITY } }|" \
        -e 's|decode { cluster { replicas: 2 } }|decode { cluster { replicas: 1 } }|' \
        "$scenario" > "$tmp/pd_store.pbtxt"
      run pds "$tmp/pd_store.pbtxt" "${wl[@]}" "${slo[@]}"
      row pds "$tag: P/D 3 + 1, prefill DRAM + store"
    fi
  done
fi

if [ "$what" = all ] || [ "$what" = plot ]; then
  # Each configuration's arguments, then the scenario file, by label.
  sed -e '/disaggregation {/,/^  }/d' -e 's/tensor_parallel: 4/tensor_parallel: 4\n  replicas: 4/' \
    "$scenario" > "$tmp/colocated.pbtxt"
  tiers='kv_tiers { tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 200e9 link { preset: "pcie5" } } tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 50e9 link { preset: "infiniband-ndr" } } }'
  sed -e "s|replicas: 4|replicas: 4\n  $tiers|" \
    -e 's/BATCHING_POLICY_VLLM_V1 }/BATCHING_POLICY_VLLM_V1 routing: ROUTING_POLICY_PREFIX_AFFINITY }/' \
    "$tmp/colocated.pbtxt" > "$tmp/colocated_store.pbtxt"
  sed -e "s|prefill { cluster { replicas: 2 } }|prefill { cluster { replicas: 3 $tiers } scheduler { routing: ROUTING_POLICY_PREFIX_AFFINITY } }|" \
    -e 's|decode { cluster { replicas: 2 } }|decode { cluster { replicas: 1 } }|' \
    "$scenario" > "$tmp/pd_store.pbtxt"
  pools_of() {
    echo --set cluster.disaggregation.prefill.cluster.replicas=$1 \
      --set cluster.disaggregation.decode.cluster.replicas=$2
  }
  declare -A cfg=(
    ["colocated 4xTP4"]="$tmp/colocated.pbtxt"
    ["P/D 2+2"]="$scenario $(pools_of 2 2)"
    ["P/D 3+1"]="$scenario $(pools_of 3 1)"
    ["P/D 3+1 AttAcc"]="$scenario $(pools_of 3 1) --set cluster.disaggregation.decode.cluster.attacc.preset=attacc_bank"
    ["colocated tiers"]="$tmp/colocated_store.pbtxt"
    ["P/D 3+1 tiers"]="$tmp/pd_store.pbtxt"
  )
  for trace in azure mooncake; do
    if [ $trace = azure ]; then
      path=$traces/AzureLLMInferenceTrace_conv.csv rates="1 2 3 4 5 6"
      labels=("colocated 4xTP4" "P/D 2+2" "P/D 3+1" "P/D 3+1 AttAcc")
      title="Azure conversation, 16 H100: goodput (TTFT <= 2 s, TPOT <= 50 ms)"
    else
      path=$traces/synthetic_trace.jsonl rates="0.125 0.25 0.375 0.5"
      # tiers: host DRAM + the cluster store, prefix-aware routing (the
      # prefill pool's, split).
      labels=("colocated 4xTP4" "P/D 3+1" "colocated tiers" "P/D 3+1 tiers")
      title="Mooncake trace, 16 H100: goodput (TTFT <= 2 s, TPOT <= 50 ms)"
    fi
    csv=docs/img/disaggregation_$trace.csv
    echo "configuration,rate_scale,goodput_requests_per_s,slo_attainment,ttft_p99_s,tpot_p99_s" > "$csv"
    for label in "${labels[@]}"; do
      for rate in $rates; do
        # shellcheck disable=SC2086  # the configuration's words
        run p ${cfg[$label]} --set workload.trace.path="$path" --set workload.rate_scale="$rate" \
          --set slo.ttft_s=2 --set slo.tpot_s=0.05
        python3 - "$tmp/p" "$label" "$rate" >> "$csv" <<'PY'
import json, sys
d, label, rate = sys.argv[1:]
s = json.load(open(f"{d}/summary.json"))
print(f"{label},{rate},{s['goodput_requests_per_s']:.4f},{s['slo_attainment']:.4f},"
      f"{s['ttft_s']['p99']:.4f},{s['tpot_s']['p99']:.4f}")
PY
      done
    done
    "$bin" plot "$csv" --x rate_scale --y goodput_requests_per_s --group configuration \
      --title "$title" --out "docs/img/disaggregation_$trace.svg"
  done
fi

if [ "$what" = all ] || [ "$what" = speed ]; then
  echo
  echo "speed: N DGX H100 nodes, N prefill + N decode TP4 replicas, Azure conv hour x N/2, one core"
  printf '%6s %9s %9s %9s %8s %10s %11s %9s\n' nodes requests steps wall_s "x real" "req/wall_s" \
    "steps/wall_s" "peak_MB"
  for n in ${N_NODES:-16 32 64}; do
    run "speed$n" "$scenario" --set cluster.disaggregation.prefill.cluster.replicas="$n" \
      --set cluster.disaggregation.decode.cluster.replicas="$n" --set workload.rate_scale=$((n / 2)) \
      --set workload.repeat=$((n / 2))
    python3 - "$tmp/speed$n" "$n" "$(cat "$tmp/speed$n.rss")" <<'PY'
import json, sys
d, n, rss = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(f"{d}/summary.json"))
w = json.load(open(f"{d}/run_info.json"))["wall_time_s"]
print(f"{n:>6} {s['requests']:>9} {s['iterations']:>9} {w:>9.2f} {s['simulated_time_s'] / w:>8.0f} "
      f"{s['requests'] / w:>10.0f} {s['iterations'] / w:>11.0f} {rss / 1024:>9.0f}")
PY
  done
fi
