#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (ctest), then the same suite
# under AddressSanitizer/UndefinedBehaviorSanitizer
# (scripts/test_sanitized.sh), then a short smoke run of every fuzz target
# (scripts/fuzz.sh, 20 s each). Any failure fails the script, and so does a
# test that was skipped or not run unless tests/allowed_skips.txt allows it
# (scripts/check_skips.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# Chromium, Prometheus and Node for the live-dashboard tests first, so that
# cmake (in setup.sh) finds node and python3 when it configures the tests.
scripts/setup_dashboard_tests.sh
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j"$jobs" --output-junit ctest-results.xml
scripts/check_skips.sh build/ctest-results.xml
scripts/test_sanitized.sh --jobs "$jobs"
scripts/fuzz.sh all --time "${SERVESIM_FUZZ_SMOKE_S:-20}" --jobs "$jobs"
