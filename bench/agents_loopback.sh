#!/usr/bin/env bash
# Device agents vs in process: the AttAcc Azure conversation example
# (DGX+AttAccs, one hour of trace) run in process, with its AttAcc device on
# a servesim-agent process on loopback, and with both of its devices (xPU and
# AttAcc) on agents. Prints each median wall time, the ratios to in process
# (target: <= 3 with AttAcc via an agent) and the agents' call counts, and
# checks the outputs are byte-identical.
# Usage: bench/agents_loopback.sh [RUNS] [SCENARIO] [-- extra servesim args]
#        (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
scenario=${2:-examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
extra=("$@")
bin=build/services/servesim
agent=build/services/servesim-agent
[ -x "$bin" ] && [ -x "$agent" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
start_agent() {  # KIND -> prints HOST:PORT
  "$agent" --device "$1" --listen 127.0.0.1:0 2>"$tmp/$1.log" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q serving "$tmp/$1.log" && break
    sleep 0.05
  done
}
start_agent gpu
start_agent attacc
gpu=$(sed -n 's/.* on \([^ ]*\).*/\1/p' "$tmp/gpu.log")
attacc=$(sed -n 's/.* on \([^ ]*\).*/\1/p' "$tmp/attacc.log")
for i in $(seq "$runs"); do
  "$bin" run "$scenario" --quiet --out "$tmp/in$i" "${extra[@]}"
  "$bin" run "$scenario" --quiet --out "$tmp/aa$i" --agent "attacc=$attacc" "${extra[@]}"
  "$bin" run "$scenario" --quiet --out "$tmp/ag$i" --agent "gpu=$gpu" --agent "attacc=$attacc" \
    "${extra[@]}"
  for f in summary.json requests.csv iterations.csv; do
    for m in aa ag; do
      cmp -s "$tmp/in$i/$f" "$tmp/$m$i/$f" || { echo "$f differs between in-process and $m" >&2; exit 1; }
    done
  done
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
wall = lambda k: statistics.median(
    json.load(open(f"{d}/{k}{i}/run_info.json"))["wall_time_s"] for i in range(1, n + 1))
w_in = wall("in")
print(f"in_process_wall_s={w_in:.3f}")
for mode, label in (("aa", "attacc_agent"), ("ag", "both_agents")):
    w = wall(mode)
    info = json.load(open(f"{d}/{mode}1/run_info.json"))
    rpcs = 0
    print(f"{label}_wall_s={w:.3f}")
    print(f"{label}_ratio={w / w_in:.2f}")
    for a in info["agents"]:
        name = a["device"].split("(")[-1].rstrip(")")
        rpcs += a["estimate_rpcs"]
        print(f"  {name}_estimate_calls={a['estimate_calls']} {name}_estimate_rpcs={a['estimate_rpcs']} "
              f"{name}_prefetch_rpcs={a['prefetch_rpcs']} {name}_memo_hit_rate={a['memo_hit_rate']:.3f}")
        print(f"  {name}_expected_ops={a['expected_ops']} {name}_expected_hits={a['expected_hits']} "
              f"{name}_expect_waits={a['expect_waits']} {name}_predicted_ops={a['predicted_ops']}")
    print(f"  overhead_us_per_rpc={(w - w_in) / max(1, rpcs) * 1e6:.1f}")
PY
echo "outputs byte-identical: yes"
