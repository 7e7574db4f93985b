#!/usr/bin/env bash
# Sets up, builds, and runs a scenario (default: the embedded default
# example, GPT-3 175B on 4 DGX "A100 with HBM3" replicas serving the Azure
# conversation trace). Extra arguments go to `servesim run`.
# Usage: scripts/run.sh [SCENARIO.pbtxt] [servesim run options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scenario=examples/gpt3_175b_dgx_azure_conv.pbtxt
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then scenario=$1; shift; fi
exec build/services/servesim run "$scenario" --out out/"$(basename "$scenario" .pbtxt)" "$@"
