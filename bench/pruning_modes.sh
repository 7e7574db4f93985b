#!/usr/bin/env bash
# Wall time of CALIBRATED against ANALYTIC fidelity for the token-pruning
# devices, on the first 10,000 requests of the Azure conversation trace with
# GPT-3 175B on DGX + ToPick / SpAtten pools (examples/pruning/). Prints the
# median wall time of RUNS runs of each mode, pinned to one core, and the
# ratio (target: calibrated <= 1.2 x analytic).
# Usage: bench/pruning_modes.sh [RUNS]      (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
bin=build/services/servesim
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for kind in topick spatten; do
  scenario=examples/pruning/gpt3_175b_${kind}_azure_calibrated.pbtxt
  for mode in ANALYTIC CALIBRATED; do
    for i in $(seq "$runs"); do
      "${pin[@]}" "$bin" run "$scenario" --quiet --out "$tmp/$kind-$mode-$i" \
        --set workload.max_requests=10000 --set output.iterations_csv=false \
        --set output.timeline=false --set output.report_html=false \
        --set "cluster.attention_pool.$kind.fidelity=PRUNE_FIDELITY_$mode"
    done
  done
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
for kind in ("topick", "spatten"):
    wall = {}
    for mode in ("ANALYTIC", "CALIBRATED"):
        wall[mode] = statistics.median(
            json.load(open(f"{d}/{kind}-{mode}-{i}/run_info.json"))["wall_time_s"]
            for i in range(1, n + 1))
    s = json.load(open(f"{d}/{kind}-CALIBRATED-1/summary.json"))
    print(f"{kind}_requests={s['requests']}")
    print(f"{kind}_analytic_wall_s={wall['ANALYTIC']:.3f}")
    print(f"{kind}_calibrated_wall_s={wall['CALIBRATED']:.3f}")
    print(f"{kind}_calibrated_over_analytic={wall['CALIBRATED'] / wall['ANALYTIC']:.3f}")
PY
