#!/usr/bin/env bash
# How servesim's cost scales (issue 8): the Azure conversation hour with
# GPT-3 175B, every decode iteration modelled, on SCENARIO (default: 4
# DGX+AttAcc replicas). Two sweeps, one run each, pinned to one core:
#  - the trace's arrival rate x1, x4, x16 (workload.rate_scale: the same
#    19,366 requests in 1/4, 1/16 of the time) on the scenario's replicas;
#  - 1 to 64 replicas with the rate scaled with them (per-replica load held
#    at the scenario's: rate_scale = replicas / 4).
# Prints wall seconds, simulated requests per wall-second, the real-time
# factor, iterations per wall-second and peak memory (max RSS).
# Usage: bench/scaling.sh [SCENARIO]      (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt}
bin=build/services/servesim
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # name, then --set arguments
  local name=$1; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  /usr/bin/time -f "%M" -o "$tmp/$name.rss" "${pin[@]}" "$bin" run "$scenario" --quiet \
    --out "$tmp/$name" --set output.iterations_csv=false --set output.timeline=false \
    --set output.report_html=false --set output.requests_csv=false "${sets[@]}"
  python3 - "$tmp/$name" "$name" "$(cat "$tmp/$name.rss")" <<'PY'
import json, sys
d, name, rss_kb = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(f"{d}/summary.json"))
w = json.load(open(f"{d}/run_info.json"))["wall_time_s"]
print(f"{name:<14} requests={s['requests']:>6} iterations={s['iterations']:>8} "
      f"wall_s={w:7.2f} requests_per_wall_s={s['requests'] / w:8.0f} "
      f"realtime_factor={s['simulated_time_s'] / w:7.0f} iterations_per_wall_s={s['iterations'] / w:8.0f} "
      f"peak_rss_mb={rss_kb / 1024:6.0f}")
PY
}
for x in 1 4 16; do run "rate_x$x" "workload.rate_scale=$x"; done
for r in 1 4 16 64; do
  run "replicas_$r" "cluster.replicas=$r" "workload.rate_scale=$(awk "BEGIN { print $r / 4 }")"
done
