#!/bin/sh
# Device agents on several hosts, really: two network namespaces,
# each joined to a third (the simulator's) by a veth pair, an agent in each
# on its own address, and a scenario whose devices are split across them
# (the xPU device on host A, the AttAcc device on host B). The outputs must
# be byte-identical to the in-process run. Traffic stays on the namespaces'
# veth links. Needs root and iproute2: otherwise SKIP (exit 77).
#
# Usage: multihost_test.sh SERVESIM SERVESIM_AGENT SCENARIO
set -u
SERVESIM=$1
AGENT=$2
SCENARIO=$3
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the multihost test needs root (network namespaces); run as root (CI does)"
  exit 77
fi
if ! command -v ip >/dev/null 2>&1; then
  echo "SKIP: 'ip' (iproute2) not found; scripts/setup.sh installs it"
  exit 77
fi
TAG="ss$$"
NS_SIM="${TAG}sim"; NS_A="${TAG}a"; NS_B="${TAG}b"
if ! ip netns add "$NS_SIM" 2>/dev/null; then
  echo "SKIP: 'ip netns add' is not permitted here (no CAP_SYS_ADMIN?)"
  exit 77
fi
WORK=$(mktemp -d)
PIDS=""
cleanup() {
  for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
  for ns in "$NS_SIM" "$NS_A" "$NS_B"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
fail() { echo "FAIL: $*"; exit 1; }

ip netns add "$NS_A" || fail "ip netns add $NS_A"
ip netns add "$NS_B" || fail "ip netns add $NS_B"
# sim <-> A on 10.231.1.0/24, sim <-> B on 10.231.2.0/24.
ip link add "${TAG}sa" netns "$NS_SIM" type veth peer name "${TAG}as" netns "$NS_A" \
  || fail "veth sim<->A"
ip link add "${TAG}sb" netns "$NS_SIM" type veth peer name "${TAG}bs" netns "$NS_B" \
  || fail "veth sim<->B"
ip -n "$NS_SIM" addr add 10.231.1.1/24 dev "${TAG}sa"
ip -n "$NS_A" addr add 10.231.1.2/24 dev "${TAG}as"
ip -n "$NS_SIM" addr add 10.231.2.1/24 dev "${TAG}sb"
ip -n "$NS_B" addr add 10.231.2.2/24 dev "${TAG}bs"
for ns in "$NS_SIM" "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_SIM" link set "${TAG}sa" up; ip -n "$NS_A" link set "${TAG}as" up
ip -n "$NS_SIM" link set "${TAG}sb" up; ip -n "$NS_B" link set "${TAG}bs" up

ip netns exec "$NS_A" "$AGENT" --device gpu --listen 10.231.1.2:50051 2>"$WORK/a.log" &
PIDS="$PIDS $!"
ip netns exec "$NS_B" "$AGENT" --device attacc --listen 10.231.2.2:50051 2>"$WORK/b.log" &
PIDS="$PIDS $!"
for i in $(seq 1 100); do
  grep -q serving "$WORK/a.log" && grep -q serving "$WORK/b.log" && break
  sleep 0.1
done
grep -q "serving gpu on 10.231.1.2:50051" "$WORK/a.log" || fail "agent A: $(cat "$WORK/a.log")"
grep -q "serving attacc on 10.231.2.2:50051" "$WORK/b.log" || fail "agent B: $(cat "$WORK/b.log")"
# Host A's agent is not reachable from host B's namespace (no route).
if ip netns exec "$NS_B" "$SERVESIM" run "$SCENARIO" --quiet --set workload.window_end_s=120 \
     --agent gpu=10.231.1.2:50051 --agent-deadline 2 >/dev/null 2>&1; then
  fail "host B reached host A's agent: the namespaces are not isolated"
fi

ARGS="--quiet --set workload.window_end_s=120"
"$SERVESIM" run "$SCENARIO" $ARGS --out "$WORK/in" || fail "in-process run"
ip netns exec "$NS_SIM" "$SERVESIM" run "$SCENARIO" $ARGS --out "$WORK/split" \
  --agent gpu=10.231.1.2:50051 --agent attacc=10.231.2.2:50051 || fail "run over agents"
for f in summary.json requests.csv iterations.csv; do
  cmp "$WORK/in/$f" "$WORK/split/$f" || fail "$f differs between in-process and split agents"
done
grep -q '"endpoints": \["10.231.1.2:50051"\]' "$WORK/split/run_info.json" || fail "no gpu agent stats"
grep -q '"endpoints": \["10.231.2.2:50051"\]' "$WORK/split/run_info.json" || fail "no attacc agent stats"
echo "PASS: byte-identical outputs with the xPU device on $NS_A and AttAcc on $NS_B"
exit 0
