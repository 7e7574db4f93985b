#!/usr/bin/env bash
# Hostile and careless inputs against the servesim program, one or more per
# class of docs/outputs.md's "What is checked at the borders" and "The output
# folder, interrupts and exit status": a user's files kept, signals that stop
# everything, numbers checked, SimGrid's aborts turned into errors, bounded
# reading, messages that name the cause. Loopback only; every command is
# bounded by `timeout`. Prints one line per case and exits 1 if any failed.
#
# Usage: tests/robustness_probe.sh SERVESIM_BINARY
set -uo pipefail
bin="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
example="$root/examples/gpt3_175b_dgx_azure_conv.pbtxt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0

# check NAME EXPECTED_EXIT PATTERN -- COMMAND...: runs COMMAND (60 s at most)
# and wants its exit status and a line of its output matching PATTERN.
check() {
  local name="$1" want="$2" pattern="$3"
  shift 4
  local out rc
  out="$(timeout 60 "$@" 2>&1)"
  rc=$?
  if [ "$rc" = "$want" ] && grep -qE -- "$pattern" <<<"$out"; then
    printf 'ok    %s\n' "$name"
  else
    printf 'FAIL  %s (exit %s, wanted %s; /%s/)\n%s\n' "$name" "$rc" "$want" "$pattern" \
      "$(tail -5 <<<"$out")"
    failed=1
  fi
}
# same NAME A B: the two files are identical (a user's file left alone).
same() {
  if cmp -s "$2" "$3"; then printf 'ok    %s\n' "$1"; else printf 'FAIL  %s\n' "$1"; failed=1; fi
}
short=(--quiet --set workload.window_end_s=60)

# -- the user's files ------------------------------------------------------
mkdir -p "$work/mine"
echo "my results" > "$work/mine/summary.json"
cp "$work/mine/summary.json" "$work/summary.keep"
check "foreign folder refused" 1 "no \.servesim\.lock, so servesim did not write it" -- \
  "$bin" run "$example" --out "$work/mine" "${short[@]}"
same "foreign folder's file kept" "$work/mine/summary.json" "$work/summary.keep"
check "--force names what it replaces" 0 "replacing only summary.json there" -- \
  "$bin" run "$example" --out "$work/mine" --force "${short[@]}"
cp -r "$root/examples/vllm/runs/RTXPRO6000_Llama-3.1-8B_tp1" "$work/run"
cp "$work/run/trace.csv" "$work/trace.keep"
check "replay into its own run refused" 1 "which this command reads" -- \
  "$bin" replay "$work/run" --out "$work/run" --force --quiet
same "measured trace kept" "$work/run/trace.csv" "$work/trace.keep"
mkdir -p "$work/dirout" && "$bin" run "$example" --out "$work/dirout" "${short[@]}" >/dev/null 2>&1
rm -f "$work/dirout/report.html" && mkdir "$work/dirout/report.html"
check "a folder under an output's name is not removed" 1 "is a folder under the name of an output" -- \
  "$bin" run "$example" --out "$work/dirout" "${short[@]}"
printf 'x,y\n1,2\n' > "$work/t.csv" && cp "$work/t.csv" "$work/t.keep"
check "plot never writes over its input" 1 "is the table plotted" -- \
  "$bin" plot "$work/t.csv" --x x --y y --out "$work/t.csv"
same "plotted table kept" "$work/t.csv" "$work/t.keep"

# -- signals -----------------------------------------------------------------
# Points of the whole hour (half a second each), one at a time; the
# children are counted as soon as the parent has exited.
"$bin" sweep "$example" --out "$work/sweep" -j 1 --vary seed=1,2,3,4,5,6,7,8 \
  >"$work/sweep.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '\[1/8\]' "$work/sweep.log" && break; sleep 0.05; done
kill -TERM "$pid"; wait "$pid"; rc=$?
left="$(pgrep -f -- "[-]-out $work/sweep" | wc -l)"
if [ "$rc" = 143 ] && [ "$left" = 0 ] && grep -q "interrupted by SIGTERM" "$work/sweep.log"; then
  echo "ok    SIGTERM to a sweep's parent ends every child"
else
  echo "FAIL  SIGTERM to a sweep's parent (exit $rc, $left children left)"; failed=1
fi

# -- numbers -----------------------------------------------------------------
printf 'x,y\n1,2\n2,inf\n' > "$work/inf.csv"
check "plot refuses inf" 1 "is not a finite number" -- "$bin" plot "$work/inf.csv" --x x --y y
check "repeat past the time limit refused after one pass" 1 "lower workload.repeat to at most" -- \
  "$bin" validate "$example" --set workload.repeat=10000 --set workload.rate_scale=0.001

# -- SimGrid's aborts -------------------------------------------------------
mkdir -p "$work/pf/platforms"
sed 's/radical="0-7"/radical="0-5"/' "$root/examples/platforms/fat_tree_8x200g_2to1.xml" \
  > "$work/pf/platforms/fat_tree_8x200g_2to1.xml"
sed "s|path: \"traces/|path: \"$root/examples/traces/|" \
  "$root/examples/llama3.1_70b_pd_fat_tree_platform.pbtxt" > "$work/pf/s.pbtxt"
check "inconsistent fat tree is an error, not an abort" 1 "SimGrid cannot build this platform" -- \
  "$bin" validate "$work/pf/s.pbtxt"

# -- bounded reading and messages --------------------------------------------
check "scenario from a device refused" 1 "is a character device" -- "$bin" validate /dev/zero
check "trace from a device refused" 1 "is a character device; expected a trace file" -- \
  "$bin" validate "$example" --trace /dev/zero
gzip -c "$root/examples/traces/AzureLLMInferenceTrace_conv.csv" > "$work/gz.csv"
check "a gzip trace named as gzip" 1 "is gzip-compressed" -- "$bin" validate "$example" --trace "$work/gz.csv"
printf 'TIMESTAMP,ContextTokens\n0,1\n' > "$work/miss.csv"
check "the missing column named" 1 "lacks the column GeneratedTokens" -- \
  "$bin" validate "$example" --trace "$work/miss.csv"
ln -s loop "$work/loop"
check "a loop of links named" 1 "a loop of symbolic links" -- "$bin" validate "$work/loop"
check "missing --web-dir refused" 1 "no such folder" -- \
  "$bin" run "$example" --metrics 0 --web-dir "$work/nope" "${short[@]}"

exit $failed
