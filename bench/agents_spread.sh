#!/usr/bin/env bash
# FULL fidelity spread over device agents: a FULL-fidelity scenario run with
# its attention device on one agent, then on two, each agent in its own
# network namespace (joined to the simulator's by a veth pair) and pinned to
# its own core; fresh agents for each run, so no memo carries over. Prints
# each wall time, the ratio (target: >= 1.7), the steps each agent measured,
# and checks the outputs are byte-identical. Without root (network
# namespaces) the agents listen on loopback instead, still pinned.
# Usage: bench/agents_spread.sh [SCENARIO] [-- extra servesim args]
#        (after scripts/setup.sh; the default is the ToPick FULL example, its
#        first 16 requests arriving together)
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-examples/pruning/gpt2_medium_topick_azure_full.pbtxt}
shift $(( $# > 0 ? 1 : 0 ))
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--set workload.max_requests=16 --set workload.rate_scale=1000)
bin=$(pwd)/build/services/servesim
agent=$(pwd)/build/services/servesim-agent
[ -x "$bin" ] && [ -x "$agent" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
kind=$(grep -o -E '\b(topick|spatten|cta|lad) *\{' "$scenario" | head -1 | tr -d ' {')
[ -n "$kind" ] || { echo "no attention pool kind found in $scenario" >&2; exit 1; }
tmp=$(mktemp -d)
tag="sp$$"
netns=0
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "$netns" -eq 1 ]; then
    for ns in "${tag}sim" "${tag}a" "${tag}b"; do ip netns del "$ns" 2>/dev/null || true; done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add "${tag}sim" 2>/dev/null; then
  netns=1
  ip netns add "${tag}a"
  ip netns add "${tag}b"
  ip link add "${tag}sa" netns "${tag}sim" type veth peer name "${tag}as" netns "${tag}a"
  ip link add "${tag}sb" netns "${tag}sim" type veth peer name "${tag}bs" netns "${tag}b"
  ip -n "${tag}sim" addr add 10.232.1.1/24 dev "${tag}sa"
  ip -n "${tag}a" addr add 10.232.1.2/24 dev "${tag}as"
  ip -n "${tag}sim" addr add 10.232.2.1/24 dev "${tag}sb"
  ip -n "${tag}b" addr add 10.232.2.2/24 dev "${tag}bs"
  for ns in "${tag}sim" "${tag}a" "${tag}b"; do ip -n "$ns" link set lo up; done
  for l in sa sb; do ip -n "${tag}sim" link set "${tag}$l" up; done
  ip -n "${tag}a" link set "${tag}as" up
  ip -n "${tag}b" link set "${tag}bs" up
  addr=(10.232.1.2:50061 10.232.2.2:50061)
  in_ns=(ip netns exec "${tag}a")
  in_ns_b=(ip netns exec "${tag}b")
  sim=(ip netns exec "${tag}sim")
else
  echo "note: no network namespaces (not root?): agents on loopback"
  addr=(127.0.0.1:50061 127.0.0.1:50062)
  in_ns=()
  in_ns_b=()
  sim=()
fi
start_agents() {  # N: fresh agents on the first N addresses
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  "${in_ns[@]}" taskset -c 0 "$agent" --device "$kind" --listen "${addr[0]}" 2>"$tmp/a.log" &
  pids+=($!)
  if [ "$1" -ge 2 ]; then
    "${in_ns_b[@]}" taskset -c 1 "$agent" --device "$kind" --listen "${addr[1]}" 2>"$tmp/b.log" &
    pids+=($!)
  fi
  for _ in $(seq 100); do
    grep -q serving "$tmp/a.log" 2>/dev/null && { [ "$1" -lt 2 ] || grep -q serving "$tmp/b.log"; } && break
    sleep 0.05
  done
}
agent_cpu() {  # the running agents' CPU seconds (user + system), comma-separated
  local out=() tick
  tick=$(getconf CLK_TCK)
  for p in "${pids[@]}"; do
    # utime and stime are fields 14 and 15 of /proc/PID/stat (the name, field 2, has no spaces).
    out+=("$(awk -v t="$tick" '{printf "%.2f", ($14 + $15) / t}' "/proc/$p/stat")")
  done
  (IFS=,; echo "${out[*]}")
}
start_agents 1
"${sim[@]}" "$bin" run "$scenario" --quiet --out "$tmp/one" --agent "$kind=${addr[0]}" "${extra[@]}"
agent_cpu > "$tmp/one_cpu"
start_agents 2
"${sim[@]}" "$bin" run "$scenario" --quiet --out "$tmp/two" --agent "$kind=${addr[0]},${addr[1]}" \
  "${extra[@]}"
agent_cpu > "$tmp/two_cpu"
for f in summary.json requests.csv iterations.csv; do
  cmp -s "$tmp/one/$f" "$tmp/two/$f" || { echo "$f differs between one and two agents" >&2; exit 1; }
done
python3 - "$tmp" "$kind" "$netns" <<'PY'
import json, sys
d, kind, netns = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
info = {m: json.load(open(f"{d}/{m}/run_info.json")) for m in ("one", "two")}
w1, w2 = info["one"]["wall_time_s"], info["two"]["wall_time_s"]
a = info["two"]["agents"][0]
print(f"device={kind} hosts={'network namespaces' if netns else 'loopback'}")
print(f"one_agent_wall_s={w1:.2f}")
print(f"two_agents_wall_s={w2:.2f}")
print(f"speedup={w1 / w2:.2f}")
cpu = lambda m: open(f"{d}/{m}_cpu").read().strip()
print(f"  agent_cpu_s: one=[{cpu('one')}] two=[{cpu('two')}]")
print(f"  measured_steps={a['measured_steps']} measure_rpcs={a['measure_rpcs']} "
      f"estimate_rpcs={a['estimate_rpcs']} ahead_rpcs={a['ahead_rpcs']}")
print("outputs byte-identical: yes")
PY
