#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz/) on their seed corpora.
# Usage: scripts/fuzz.sh [TARGET|all] [--time SECONDS | --runs N] [--merge]
#                        [--jobs N]
#   TARGET     one of the targets below (default: all, one after another)
#   --time S   run each target for S seconds (default 20)
#   --runs N   run each target for N executions instead
#   --merge    afterwards, merge the inputs that found new coverage into
#              tests/fuzz/corpus/TARGET (otherwise the repository is never
#              written: new inputs go to a scratch folder)
#   --jobs N   build with N jobs and run N targets at a time (default: the
#              number of cores)
# Installs what is missing (scripts/setup.sh --sanitizers --no-build),
# configures and builds build-asan/ (scripts/configure_sanitized.sh) if
# needed. Each run has -timeout (a single input slower than 10 s is a
# failure) and -rss_limit_mb (a process above 2 GiB is a failure).
# Prints executions and the result per target; a crash leaves its input in
# build-asan/fuzz-artifacts/TARGET/ (and prints it in base64, for CI logs)
# and makes the script exit 1.
set -euo pipefail
cd "$(dirname "$0")/.."
targets_all=(scenario_fuzz trace_azure_fuzz trace_mooncake_fuzz trace_burstgpt_fuzz
             trace_length_csv_fuzz trace_plain_csv_fuzz trace_token_ids_fuzz npy_fuzz agent_fuzz
             inference_perf_fuzz)
which=all
time_s=20
runs=""
merge=0
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_s="$2"; runs=""; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
    *) which="$1"; shift ;;
  esac
done
if [ "$which" = all ]; then
  targets=("${targets_all[@]}")
else
  case " ${targets_all[*]} " in
    *" $which "*) targets=("$which") ;;
    *) echo "fuzz: unknown target $which; expected all or one of: ${targets_all[*]}" >&2; exit 2 ;;
  esac
fi

scripts/setup.sh --sanitizers --no-build
scripts/configure_sanitized.sh
cmake --build build-asan -j"$jobs" --target "${targets[@]}" >/dev/null

# Leaks: the targets keep services and presets for the whole process, so
# leak detection at exit would only report those.
export ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
printf '%-24s %12s %8s %10s  %s\n' target executions seconds exec/s result
# One target's run: its row of the table into $scratch/$t.row, its report
# (if it failed) into $scratch/$t.report, exit 1 if it failed.
run_target() {
  local t=$1
  local corpus=tests/fuzz/corpus/$t
  local artifacts=build-asan/fuzz-artifacts/$t
  mkdir -p "$scratch/$t" "$artifacts"
  local limit=(-max_total_time="$time_s")
  [ -n "$runs" ] && limit=(-runs="$runs")
  local log=$scratch/$t.log
  local start end rc execs secs rate result unit
  start=$(date +%s.%N)
  set +e
  build-asan/tests/fuzz/$t "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$scratch/$t" "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  end=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=${execs:-0}
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  rate=$(awk -v n="$execs" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0) ? n / s : 0 }')
  if [ $rc -eq 0 ]; then
    result=ok
  else
    result="FAILED (exit $rc; input in $artifacts/)"
    {
      grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -20 || true
      # The input itself, so that a CI log (whose machine is gone) keeps it:
      # echo '...' | base64 -d > input; build-asan/tests/fuzz/TARGET input
      unit=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
      if [ -n "$unit" ] && [ -f "$unit" ] && [ "$(stat -c %s "$unit")" -le 65536 ]; then
        echo "failing input (base64): $(base64 -w0 "$unit")"
      fi
    } >"$scratch/$t.report"
    cp "$log" "$artifacts/last.log"
  fi
  printf '%-24s %12s %8s %10s  %s\n' "$t" "$execs" "$secs" "$rate" "$result" >"$scratch/$t.row"
  if [ $merge -eq 1 ] && [ $rc -eq 0 ]; then
    build-asan/tests/fuzz/$t -merge=1 -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
      "$corpus" "$scratch/$t" >"$scratch/$t.merge.log" 2>&1
    echo "  merged into $corpus: $(ls "$corpus" | wc -l) inputs" >>"$scratch/$t.row"
  fi
  [ $rc -eq 0 ]
}

# The targets run --jobs at a time (each is one process on one core), the
# table printed in the targets' order.
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
wait || true
for t in "${targets[@]}"; do
  cat "$scratch/$t.row"
  if [ -f "$scratch/$t.report" ]; then
    cat "$scratch/$t.report" >&2
    failed=1
  fi
done
exit $failed
