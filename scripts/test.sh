#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup_dashboard_tests.sh  # Chromium, Prometheus, Node for the live-dashboard tests
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j"$jobs"
