#!/usr/bin/env bash
# Speed of `servesim replay` on the shipped measured vLLM run (300 requests,
# its profile bundle): the whole command's wall time (process start to exit:
# setup.json, the token-id workload merge, the bundle load, the run, the
# comparison and the charts), median of RUNS runs pinned to one core, as
# key=value lines; then the bundle load alone (bench/hot_path_bench.cc's
# BM_GpuProfileLoad). Usage: bench/replay.sh [RUNS]   (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
bin=${SERVESIM_BIN:-build/services/servesim}
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
  start=$(date +%s.%N)
  "${pin[@]}" "$bin" replay examples/vllm/runs/RTXPRO6000_Llama-3.1-8B_tp1 \
      --profiles examples/vllm/profiles --out "$tmp/$i" --quiet 2>/dev/null
  end=$(date +%s.%N)
  echo "$start $end" > "$tmp/$i/wall"
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
walls = []
for i in range(1, n + 1):
    a, b = map(float, open(f"{d}/{i}/wall").read().split())
    walls.append(b - a)
sim = [json.load(open(f"{d}/{i}/run_info.json"))["wall_time_s"] for i in range(1, n + 1)]
print(f"replay_wall_s={statistics.median(walls):.3f}")
print(f"replay_wall_s_min={min(walls):.3f}")
print(f"replay_wall_s_max={max(walls):.3f}")
print(f"run_wall_s={statistics.median(sim):.3f}")
PY
if [ -x build/bench/servesim_bench ]; then
  "${pin[@]}" build/bench/servesim_bench --benchmark_filter=BM_GpuProfileLoad \
      --benchmark_min_time=1 2>/dev/null | grep BM_
fi
