#!/usr/bin/env bash
# Simulation speed on today's model layouts: DeepSeek-V3 on 32 GPUs (32
# data-parallel ranks, experts over all of them, across 4 nodes), the same
# with skewed routing, Qwen3-235B-A22B DP8+EP8 and Llama-3.1-405B TP8 x PP2,
# each over its example's workload, pinned to one core, once each (RUNS=n
# for the median of n). Prints wall seconds, the real-time factor (target:
# >= 1,000x for DeepSeek-V3 on 32 GPUs), steps per wall second and peak
# memory. Outputs other than summary.json are off, as in bench/scaling.sh.
# Usage: bench/modern_models.sh      (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SERVESIM_BIN:-build/services/servesim}
runs=${RUNS:-1}
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # name, scenario, then --set arguments
  local name=$1 scenario=$2; shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  for i in $(seq "$runs"); do
    /usr/bin/time -f "%M" -o "$tmp/$name.$i.rss" "${pin[@]}" "$bin" run "$scenario" --quiet \
      --out "$tmp/$name.$i" --set output.iterations_csv=false --set output.timeline=false \
      --set output.report_html=false --set output.requests_csv=false "${sets[@]}"
  done
  python3 - "$tmp" "$name" "$runs" <<'PY'
import json, statistics, sys
d, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
walls = [json.load(open(f"{d}/{name}.{i}/run_info.json"))["wall_time_s"] for i in range(1, n + 1)]
w = statistics.median(walls)
s = json.load(open(f"{d}/{name}.1/summary.json"))
rss = max(int(open(f"{d}/{name}.{i}.rss").read()) for i in range(1, n + 1))
print(f"{name:<22} requests={s['requests']:>6} steps={s['iterations']:>7} wall_s={w:6.2f} "
      f"realtime_factor={s['simulated_time_s'] / w:6.0f} steps_per_wall_s={s['iterations'] / w:7.0f} "
      f"peak_rss_mb={rss / 1024:5.0f}")
PY
}
run deepseek_v3_dp32 examples/deepseek_v3_dp32_ep32_azure_conv.pbtxt
run deepseek_v3_dp32_skew1 examples/deepseek_v3_dp32_ep32_azure_conv.pbtxt model.routing_skew=1
run qwen3_235b_dp8 examples/qwen3_235b_a22b_dp8_ep8_azure_conv.pbtxt
run llama3.1_405b_tp8_pp2 examples/llama3.1_405b_tp8_pp2_2xdgx_h100.pbtxt
