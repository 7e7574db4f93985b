#!/usr/bin/env bash
# How servesim's cost scales: the Azure conversation hour with
# GPT-3 175B, every decode iteration modelled, on SCENARIO (default: 4
# DGX+AttAcc replicas). Three sweeps, one run each, pinned to one core:
#  - the trace's arrival rate x1, x4, x16 (workload.rate_scale: the same
#    19,366 requests in 1/4, 1/16 of the time) on the scenario's replicas;
#  - the trace concatenated x1, x4, x16 (workload.repeat: 4 and 16 times
#    the requests over 4 and 16 times the time, at the trace's rate), which
#    is what memory must not grow with;
#  - 1 to 64 replicas with the rate scaled with them (per-replica load held
#    at the scenario's: rate_scale = replicas / 4).
# Prints wall seconds, simulated requests per wall-second, the real-time
# factor, iterations per wall-second and peak memory (max RSS).
# Usage: bench/scaling.sh [SCENARIO]      (after scripts/setup.sh)
# Environment: SERVESIM_BIN (default build/services/servesim) to measure
# another build; CONCAT_FILES=1 to concatenate by writing the x4 and x16
# trace files instead of workload.repeat (for builds without it; the files
# shift each pass by the same period, rounded to the trace's 100 ns);
# SWEEPS (default "rate concat replicas") to run fewer sweeps.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt}
bin=${SERVESIM_BIN:-build/services/servesim}
sweeps=${SWEEPS:-rate concat replicas}
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
# Writes the scenario's Azure trace concatenated $1 times to $tmp/concat_x$1.csv
# (pass k shifted by k periods: the trace's span plus its mean gap).
concat_trace() {
  local trace
  trace=$(sed -n 's/.*trace *{ *path: *"\([^"]*\)".*/\1/p' "$scenario" | head -1)
  python3 - "$(dirname "$scenario")/$trace" "$1" "$tmp/concat_x$1.csv" <<'PY'
import datetime, sys
src, times, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = open(src).read().splitlines()
head, rows = lines[0], [l for l in lines[1:] if l.strip()]
def ticks(ts):  # 100 ns ticks since the epoch
    day, frac = (ts.split(".") + ["0"])[:2]
    t = datetime.datetime.strptime(day, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return int(t.timestamp()) * 10**7 + int(frac.ljust(7, "0")[:7])
t = [ticks(r.split(",")[0]) for r in rows]
span = max(t) - min(t)
period = round(span + span / (len(t) - 1))
with open(dst, "w") as out:
    out.write(head + "\n")
    for k in range(times):
        for r, x in zip(rows, t):
            x += k * period
            s = datetime.datetime.fromtimestamp(x // 10**7, datetime.timezone.utc)
            out.write(f"{s:%Y-%m-%d %H:%M:%S}.{x % 10**7:07d}," + r.split(",", 1)[1] + "\n")
PY
}
for sweep in $sweeps; do
  case $sweep in
    rate) for x in 1 4 16; do run "rate_x$x" "workload.rate_scale=$x"; done ;;
    concat)
      for x in 1 4 16; do
        if [ "${CONCAT_FILES:-0}" = 1 ]; then
          concat_trace "$x"
          run "concat_x$x" "workload.trace.path=$tmp/concat_x$x.csv"
        else
          run "concat_x$x" "workload.repeat=$x"
        fi
      done ;;
    replicas)
      for r in 1 4 16 64; do
        run "replicas_$r" "cluster.replicas=$r" "workload.rate_scale=$(awk "BEGIN { print $r / 4 }")"
      done ;;
  esac
done
