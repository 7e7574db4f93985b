#!/bin/sh
# What attention offload buys on today's models (an example study): the
# AttAcc paper's static evaluation (§7: 128 requests of 2,048 prompt and 512
# output tokens, all present at t=0, SLO-limited batching) on one DGX of 8
# A100-HBM3 GPUs (TP=8) without (DGX_Base) and with 40 AttAcc stacks
# (head-level pipelining; FF co-processing needs a dense FF, so it is off for
# every model here), for GPT-3 175B (multi-head attention), Llama-3.1-70B
# (GQA 8:1), Mixtral-8x22B (GQA 6:1, 8 experts top-2) and Qwen3-235B-A22B
# (GQA 16:1, 128 experts top-8), under TBT limits of 30, 50 and 70 ms.
#
#   scripts/offload_modern_models.sh
#   MODELS="gpt3-175b qwen3-235b-a22b" SLOS_MS=50 scripts/offload_modern_models.sh
#
# Environment: SERVESIM (default build/services/servesim), OUT (default
# out/offload_modern), and the lists MODELS and SLOS_MS. Results:
# OUT/offload.csv and OUT/offload.svg (throughput against the TBT limit, a
# line per system and model). Energy per token twice: with servesim's busy
# GPU power (the presets', docs/energy.md), and as the paper counts it (the
# multiplier's 0.32 pJ per MAC, no busy power: energy_paper_*), the ops
# alone and with the static power.
set -eu
cd "$(dirname "$0")/.."
SERVESIM=${SERVESIM:-build/services/servesim}
OUT=${OUT:-out/offload_modern}
MODELS=${MODELS:-"gpt3-175b llama3.1-70b mixtral-8x22b qwen3-235b-a22b"}
SLOS_MS=${SLOS_MS:-"30 50 70"}

mkdir -p "$OUT"
csv="$OUT/offload.csv"
echo "system,model,tbt_slo_ms,throughput_tokens_per_s,energy_per_token_j,batch_size_mean,tbt_p99_ms,energy_paper_ops_j,energy_paper_j" > "$csv"
for system in dgx_base attacc; do
  case $system in
    dgx_base) scenario=examples/attacc/gpt3_175b_dgx_base_saturated.pbtxt ;;
    attacc) scenario=examples/attacc/gpt3_175b_dgx_attacc_saturated.pbtxt ;;
  esac
  for model in $MODELS; do
    for slo in $SLOS_MS; do
      dir="$OUT/${system}_${model}_tbt${slo}ms"
      tbt=$(awk "BEGIN { print $slo / 1000 }")
      for energy in servesim paper; do
        extra=""
        [ "$energy" = paper ] && extra="--set cluster.xpu.flop_energy_pj=0.16 \
          --set cluster.xpu.int8_op_energy_pj=0.08 --set cluster.xpu.active_power_w=0"
        # shellcheck disable=SC2086
        "$SERVESIM" run "$scenario" --quiet --out "$dir/$energy" \
          --set "model.preset=$model" --set model.max_context_tokens=4096 \
          --set "slo.tbt_s=$tbt" --set "slo.tpot_s=$tbt" $extra \
          --set output.timeline=false --set output.report_html=false \
          --set output.requests_csv=false --set output.iterations_csv=false
      done
      # summary.json is one field per line: pick the figures by name.
      awk -v p="$system,$model,$slo" '
        FNR == NR && /"throughput_tokens_per_s":/ { gsub(/[",]/, "", $2); tput = $2 }
        FNR == NR && /"energy_per_token_j":/ { gsub(/[",]/, "", $2); e = $2 }
        FNR == NR && /"batch_size_mean":/ { gsub(/[",]/, "", $2); b = $2 }
        FNR == NR && /^  "tbt_s":/ { if (match($0, /"p99": [0-9.e+-]+/)) tbt = substr($0, RSTART + 7, RLENGTH - 7) * 1000 }
        FNR != NR && /"output_tokens":/ { gsub(/[",]/, "", $2); n = $2 }
        FNR != NR && /"energy_dynamic_j":/ { gsub(/[",]/, "", $2); ops = $2 }
        FNR != NR && /"energy_per_token_j":/ { gsub(/[",]/, "", $2); paper = $2 }
        END { print p "," tput "," e "," b "," tbt "," ops / n "," paper }' \
        "$dir/servesim/summary.json" "$dir/paper/summary.json" >> "$csv"
    done
  done
done
column -s, -t < "$csv"
"$SERVESIM" plot "$csv" --x tbt_slo_ms --y throughput_tokens_per_s --group system,model \
  --out "$OUT/offload.svg" \
  --title "Decode throughput under a TBT limit: DGX (8 x A100-HBM3) with and without AttAcc"
