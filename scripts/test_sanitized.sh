#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer:
# build-asan/ (scripts/configure_sanitized.sh: clang 14, -fsanitize=
# address,undefined, -fno-sanitize-recover=undefined) builds servesim,
# servesim-agent, the agent load test and the gtest binary, then ctest runs
# them with any sanitizer report fatal (halt_on_error; leaks checked at exit).
# SimGrid switches between its actors' stacks in ways ASan cannot follow:
# SERVESIM_SIMGRID_ARGS gives every `servesim run` (the tests run the
# binary) --cfg=contexts/factory:thread.
# Not run here: the dashboard tests (labels dashboards, browser, prometheus),
# which test JavaScript, HTML, Grafana queries and a Prometheus server
# against a live run — their servesim side (the metrics HTTP endpoint) is
# covered by services_test under the sanitizers.
# Usage: scripts/test_sanitized.sh [--jobs N] [--build-only | --no-build] [ctest args...]
#   --build-only  set up and build build-asan/, run nothing
#   --no-build    run ctest on build-asan/ as it is (scripts/test.sh times
#                 the two apart)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
build=1
run=1
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --build-only) run=0; shift ;;
    --no-build) build=0; shift ;;
    *) break ;;
  esac
done
if [ "$build" -eq 1 ]; then
  scripts/setup.sh --sanitizers --no-build
  scripts/configure_sanitized.sh
  cmake --build build-asan -j"$jobs" --target servesim_tests servesim servesim-agent \
    servesim-agent-load servesim-simgrid-floor >/dev/null
fi
[ "$run" -eq 1 ] || exit 0

root=$(pwd)
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=0:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/sanitizers/ubsan.supp"
# (and keeps SimGrid from logging that configuration change on stderr)
export SERVESIM_SIMGRID_ARGS="--cfg=contexts/factory:thread --log=xbt_cfg.thres:warning"
# DocFiguresTest reruns the docs' examples to pin their figures (minutes of
# FULL-fidelity kernels, an hour under ASan), and the tests labelled figures
# the bench scripts' (minutes at the papers' scale): they check figures, not
# memory.
ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE 'dashboards|browser|prometheus|figures' \
  -E '^DocFiguresTest\.' \
  --output-junit ctest-results.xml "$@"
scripts/check_skips.sh build-asan/ctest-results.xml
