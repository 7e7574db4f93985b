#!/usr/bin/env bash
# Regenerates tests/testdata/golden/*.summary.json from the golden scenarios.
# Run after a reviewed model change; commit the diff with the change.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/services/servesim
for scenario in tests/testdata/golden_*.pbtxt; do
  name=$(basename "$scenario" .pbtxt)
  tmp=$(mktemp -d)
  "$bin" run "$scenario" --quiet --out "$tmp"
  cp "$tmp/summary.json" "tests/testdata/golden/${name#golden_}.summary.json"
  rm -rf "$tmp"
  echo "updated tests/testdata/golden/${name#golden_}.summary.json"
done
