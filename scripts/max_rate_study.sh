#!/usr/bin/env bash
# Max arrival rate under TBT SLOs (an example study): the Azure
# conversation and code traces on DGX_Base vs DGX+AttAcc (4 replicas of 8
# A100-HBM3 GPUs, TP=8; AttAcc: 40 attacc_bank stacks, head-level pipelining
# + FF co-processing), GPT-3 175B and LLaMA-65B, p99 TBT <= 30/50/70 ms and
# p99 TTFT <= 2 s, 90% of requests within TTFT <= 2 s and TPOT <= the TBT
# limit. Each search scales the trace's arrival rate (workload.rate_scale:
# timestamps divided by it) within the first WINDOW seconds of the scaled
# trace, bracketing then bisecting to TOLERANCE. The TBT limit also drives
# SLO-limited batching (slo.tbt_s), as in AttAcc §7.3.
#
#   scripts/max_rate_study.sh                 # everything (24 searches; long)
#   MODELS=gpt3-175b SYSTEMS=attacc TRACES=conv SLOS_MS=50 scripts/max_rate_study.sh
#
# Environment: SERVESIM (default build/services/servesim), OUT (default
# out/max_rate), WINDOW (s, default 600), TOLERANCE (default 0.05), JOBS
# (default: the cores; searches run that many at a time), and the lists
# MODELS, SYSTEMS, TRACES, SLOS_MS.
# Searches resume: finished probes are reused. Results: OUT/max_rate.csv and
# a chart per trace, OUT/max_rate_TRACE.svg.
set -eu
cd "$(dirname "$0")/.."
SERVESIM=${SERVESIM:-build/services/servesim}
OUT=${OUT:-out/max_rate}
WINDOW=${WINDOW:-600}
TOLERANCE=${TOLERANCE:-0.05}
JOBS=${JOBS:-$(nproc)}
MODELS=${MODELS:-"gpt3-175b llama-65b"}
SYSTEMS=${SYSTEMS:-"dgx_base attacc"}
TRACES=${TRACES:-"conv code"}
SLOS_MS=${SLOS_MS:-"30 50 70"}

mkdir -p "$OUT"
csv="$OUT/max_rate.csv"

# One search: trace, system, model, slo. Writes OUT/NAME/search.csv and
# OUT/NAME.row (its line of max_rate.csv).
search() {
  trace=$1 system=$2 model=$3 slo=$4
  case $system in
    dgx_base) scenario=examples/gpt3_175b_dgx_azure_conv.pbtxt ;;
    attacc) scenario=examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt ;;
  esac
  name="${trace}_${system}_${model}_tbt${slo}ms"
  # 14% of the code trace's requests are longer than 4,096 tokens (and
  # rejected requests count as SLO misses): allow 8,192 there.
  context=4096
  [ "$trace" = code ] && context=8192
  tbt=$(awk "BEGIN { print $slo / 1000 }")
  echo "== $name" >&2
  # A point whose SLO no rate meets (the limits are below the unloaded
  # latency) is recorded with an empty rate, and the study goes on.
  if "$SERVESIM" search "$scenario" --vary-rate \
    --trace "examples/traces/AzureLLMInferenceTrace_${trace}.csv" \
    --set "model.preset=$model" --set "workload.window_end_s=$WINDOW" \
    --set "model.max_context_tokens=$context" \
    --set "slo.tbt_s=$tbt" \
    --slo "ttft_p99=2s,tbt_p99=${slo}ms" --tolerance "$TOLERANCE" -j "$PROBE_JOBS" \
    --out "$OUT/$name" > "$OUT/$name.txt" 2>&1; then
    # The answer row of search.csv: step,phase,value,pass,ttft,tbt,attainment,goodput,throughput,...
    awk -F, -v p="$trace,$system,$model,$slo" \
      '$2 == "answer" { print p "," $3 "," $8 "," $9 "," $7 }' "$OUT/$name/search.csv" \
      > "$OUT/$name.row"
  else
    tail -1 "$OUT/$name.txt" >&2
    echo "$trace,$system,$model,$slo,,,," > "$OUT/$name.row"
  fi
}

for system in $SYSTEMS; do
  case $system in
    dgx_base | attacc) ;;
    *) echo "unknown system $system (dgx_base, attacc)" >&2; exit 2 ;;
  esac
done
# The searches, in the table's order.
points=""
for trace in $TRACES; do
  for system in $SYSTEMS; do
    for model in $MODELS; do
      for slo in $SLOS_MS; do points="$points $trace,$system,$model,$slo"; done
    done
  done
done
n=$(echo $points | wc -w)
# JOBS cores: whole searches side by side (each bisection is sequential, and
# a probe run beside it on speculation is often wasted), or, with fewer
# searches than cores, each search's probes -j JOBS/searches at a time.
PROBE_JOBS=1
[ "$n" -lt "$JOBS" ] && PROBE_JOBS=$((JOBS / n))
running=0
for p in $points; do
  IFS=, read -r trace system model slo <<< "$p"
  search "$trace" "$system" "$model" "$slo" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
echo "trace,system,model,tbt_slo_ms,max_rate_scale,goodput_requests_per_s,throughput_tokens_per_s,slo_attainment" > "$csv"
for p in $points; do
  IFS=, read -r trace system model slo <<< "$p"
  cat "$OUT/${trace}_${system}_${model}_tbt${slo}ms.row" >> "$csv"
done
echo "wrote $csv" >&2
column -s, -t < "$csv"
# One chart per trace: max rate scale against the TBT limit, a line per
# system and model (OUT/max_rate_conv.svg, OUT/max_rate_code.svg).
for trace in $TRACES; do
  "$SERVESIM" plot "$csv" --x tbt_slo_ms --y max_rate_scale --group system,model \
    --where "trace=$trace" --out "$OUT/max_rate_$trace.svg" \
    --title "Max arrival-rate scale under p99 TBT and TTFT <= 2 s: Azure $trace"
done
