#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (ctest), then the same suite
# under AddressSanitizer/UndefinedBehaviorSanitizer
# (scripts/test_sanitized.sh), then a short smoke run of every fuzz target
# (scripts/fuzz.sh, 20 s each). Any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup_dashboard_tests.sh  # Chromium, Prometheus, Node for the live-dashboard tests
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j"$jobs"
scripts/test_sanitized.sh --jobs "$jobs"
scripts/fuzz.sh all --time "${SERVESIM_FUZZ_SMOKE_S:-20}" --jobs "$jobs"
