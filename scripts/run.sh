#!/usr/bin/env bash
# Sets up, builds what the run needs (the servesim program only; the device
# agent too with --build-agent), and runs a scenario (default: the embedded
# default example, GPT-3 175B on 4 DGX "A100 with HBM3" replicas serving the
# Azure conversation trace). Other arguments go to `servesim run`. The tests
# and benchmarks are built by scripts/test.sh.
# Usage: scripts/run.sh [SCENARIO.pbtxt] [--build-agent] [servesim run options]
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(--target servesim)
args=()
for a in "$@"; do
  case "$a" in
    --build-agent) targets+=(--target servesim-agent) ;;
    *) args+=("$a") ;;
  esac
done
set -- ${args[@]+"${args[@]}"}
scripts/setup.sh "${targets[@]}"
scenario=examples/gpt3_175b_dgx_azure_conv.pbtxt
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then scenario=$1; shift; fi
exec build/services/servesim run "$scenario" --out out/"$(basename "$scenario" .pbtxt)" "$@"
