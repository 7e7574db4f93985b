#!/usr/bin/env bash
# End-to-end speed on one hour of the Azure conversation trace (19,366
# requests), GPT-3 175B on 4 replicas: simulated requests per wall-second and
# the real-time factor, as key=value lines, from the median of RUNS runs
# pinned to one core. SCENARIO defaults to the GPU-only default example;
# examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt measures DGX+AttAccs.
# SERVESIM_BIN picks another build's binary (e.g. to compare two builds).
# Usage: bench/azure_conv.sh [RUNS] [SCENARIO]      (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
bin=${SERVESIM_BIN:-build/services/servesim}
scenario=${2:-examples/gpt3_175b_dgx_azure_conv.pbtxt}
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
  "${pin[@]}" "$bin" run "$scenario" --quiet --out "$tmp/$i" --set output.iterations_csv=false
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
walls = [json.load(open(f"{d}/{i}/run_info.json"))["wall_time_s"] for i in range(1, n + 1)]
s = json.load(open(f"{d}/1/summary.json"))
wall = statistics.median(walls)
print(f"requests={s['requests']}")
print(f"simulated_s={s['simulated_time_s']:.1f}")
print(f"wall_s={wall:.3f}")
print(f"wall_s_min={min(walls):.3f}")
print(f"wall_s_max={max(walls):.3f}")
print(f"requests_per_wall_s={s['requests'] / wall:.0f}")
print(f"realtime_factor={s['simulated_time_s'] / wall:.0f}")
PY
