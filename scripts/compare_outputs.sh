#!/usr/bin/env bash
# Runs every example (and a replay, a calibration, the AttAcc study) with two
# servesim binaries and compares their output files byte for byte: the check
# a change that must not move a result (a refactor, a speed-up) passes.
# run_info.json is compared without its wall-clock fields (wall_time_s and
# the like), which differ between any two runs, and the output folder's lock
# file (.servesim.lock: the writer's process id) is left out.
# Usage: scripts/compare_outputs.sh BASE_BINARY NEW_BINARY [--quick] [--out DIR]
#   --quick   leave out the FULL-fidelity examples (minutes each) and the study
#   --out DIR keep both sets of outputs there (default: a temporary folder)
# Exits 1 when any file differs or a run's exit code does.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
base=$(realpath "$1"); new=$(realpath "$2"); shift 2
quick=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "compare_outputs: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi
mkdir -p "$out"

# name|servesim arguments (OUT stands for the output folder)
jobs=()
while IFS= read -r f; do
  name=$(echo "${f#examples/}" | tr '/' '_'); name=${name%.pbtxt}
  if [ $quick -eq 1 ] && grep -qE 'fidelity: *[A-Z_]*FULL' "$f"; then continue; fi
  jobs+=("$name|run $f --out OUT --quiet")
done < <(find examples -name '*.pbtxt' -not -path '*/vllm/*' | sort)
jobs+=("replay_rtxpro6000|replay examples/vllm/runs/RTXPRO6000_Llama-3.1-8B_tp1 --out OUT --profiles examples/vllm/profiles --quiet")
jobs+=("calibrate_rtx4090|calibrate examples/vllm/profiles/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1 --out OUT/fit.pbtxt")
[ $quick -eq 1 ] || jobs+=("study_attacc|study attacc --out OUT --no-trace")

# run_info.json without the fields that measure the wall clock or the host.
normalise() {
  sed -E 's/"(wall_time_s|wall_s|realtime_factor|real_time_factor|cpu_s|rss_bytes|max_rss_bytes|host|started|finished|speed)[^,}]*//g' "$1"
}

differ=0
printf '%-50s %8s %8s  %s\n' job base_s new_s result
for job in "${jobs[@]}"; do
  name=${job%%|*}; args=${job#*|}
  for side in base new; do
    # Both sides write to the same folder (outputs may name it), then move.
    dir="$out/work/$name"; rm -rf "$dir" "$out/$side/$name"; mkdir -p "$out/work" "$out/$side"
    bin=$base; [ $side = new ] && bin=$new
    a=${args//OUT/$dir}
    start=$(date +%s.%N)
    [[ "$a" == calibrate* ]] && mkdir -p "$dir"
    # shellcheck disable=SC2086
    "$bin" $a >"$out/$side/$name.log" 2>&1
    echo "exit $?" >>"$out/$side/$name.log"
    end=$(date +%s.%N)
    [ -d "$dir" ] && mv "$dir" "$out/$side/$name"
    eval "t_$side=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')"
  done
  result=same
  if ! diff -q <(tail -1 "$out/base/$name.log") <(tail -1 "$out/new/$name.log") >/dev/null; then
    result="exit codes differ"
  elif [ -d "$out/base/$name" ]; then
    while IFS= read -r rel; do
      b="$out/base/$name/$rel"; n="$out/new/$name/$rel"
      if [ ! -f "$n" ]; then result="missing $rel"; break; fi
      if [[ "$rel" == *run_info.json ]]; then
        cmp -s <(normalise "$b") <(normalise "$n") || { result="differs: $rel"; break; }
      else
        cmp -s "$b" "$n" || { result="differs: $rel"; break; }
      fi
    done < <(cd "$out/base/$name" && find . -type f ! -name .servesim.lock | sort)
    if [ "$result" = same ]; then
      extra=$(comm -13 <(cd "$out/base/$name" && find . -type f | sort) \
                       <(cd "$out/new/$name" && find . -type f | sort) | head -1)
      [ -n "$extra" ] && result="extra file $extra"
    fi
  fi
  [ "$result" = same ] || differ=1
  printf '%-50s %8s %8s  %s\n' "$name" "$t_base" "$t_new" "$result"
done
exit $differ
