#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (ctest), then the same suite
# under AddressSanitizer/UndefinedBehaviorSanitizer
# (scripts/test_sanitized.sh), then a short smoke run of every fuzz target
# (scripts/fuzz.sh, 20 s each). Any failure fails the script, and so does a
# test that was skipped or not run unless tests/allowed_skips.txt allows it
# (scripts/check_skips.sh). Ends with the time each phase took (also when a
# phase fails).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

phases=()
current=""
phase_start=$SECONDS
start_all=$SECONDS
summary() {
  local rc=$?
  [ -n "$current" ] && phases+=("$(printf '%-44s %6d s  FAILED' "$current" $((SECONDS - phase_start)))")
  echo
  echo "test: time per phase"
  for p in "${phases[@]}"; do echo "  $p"; done
  printf '  %-44s %6d s (%d min %02d s)\n' "total" $((SECONDS - start_all)) \
    $(((SECONDS - start_all) / 60)) $(((SECONDS - start_all) % 60))
  exit $rc
}
trap summary EXIT
# phase NAME COMMAND...: runs COMMAND, recording how long it took.
phase() {
  current=$1
  shift
  phase_start=$SECONDS
  "$@"
  phases+=("$(printf '%-44s %6d s' "$current" $((SECONDS - phase_start)))")
  current=""
}

# Chromium, Prometheus and Node for the live-dashboard tests first, so that
# cmake finds node and python3 when it configures the tests; then every
# package the suites need, the sanitizers' clang included.
phase "packages (dashboard tools, libraries, clang)" \
  bash -c 'scripts/setup_dashboard_tests.sh && scripts/setup.sh --sanitizers --no-build'
phase "build (Release, build/)" scripts/setup.sh --tests
phase "ctest (build/)" \
  ctest --test-dir build --output-on-failure -j"$jobs" --output-junit ctest-results.xml
phase "skips (build/)" scripts/check_skips.sh build/ctest-results.xml
phase "build (ASan + UBSan, build-asan/)" scripts/test_sanitized.sh --jobs "$jobs" --build-only
phase "ctest (build-asan/)" scripts/test_sanitized.sh --jobs "$jobs" --no-build
phase "fuzz smoke (${SERVESIM_FUZZ_SMOKE_S:-20} s per target)" \
  scripts/fuzz.sh all --time "${SERVESIM_FUZZ_SMOKE_S:-20}" --jobs "$jobs"
