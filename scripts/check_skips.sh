#!/usr/bin/env bash
# Fails when a ctest run skipped a test, or did not run it, unless the
# allow-list names it with a reason: ctest counts a skip (exit code 77, or
# GTEST_SKIP) as "Not Run" and still exits 0, so without this a missing tool
# (Chromium, Prometheus, openssl, root for network namespaces) would leave
# CI green with a test unrun.
# Usage: scripts/check_skips.sh JUNIT.xml [ALLOW_LIST]
#   JUNIT.xml: written by `ctest --output-junit`.
#   ALLOW_LIST (default tests/allowed_skips.txt): one test name per line,
#   then its reason; '#' starts a comment. Its entries are printed.
set -euo pipefail
junit=$1
allow=${2:-$(dirname "$0")/../tests/allowed_skips.txt}
[ -f "$junit" ] || { echo "check_skips: $junit not found (ctest --output-junit)" >&2; exit 1; }
declare -A reason=()
if [ -f "$allow" ]; then
  while IFS= read -r line; do
    line=${line%%#*}
    name=$(echo "$line" | awk '{print $1}')
    [ -n "$name" ] || continue
    reason[$name]=$(echo "$line" | sed -E 's/^[[:space:]]*[^[:space:]]+[[:space:]]*//; s/[[:space:]]+$//')
  done < "$allow"
fi
ran=0 bad=0 allowed=0
while IFS=$'\t' read -r name status; do
  ran=$((ran + 1))
  case "$status" in
    run|fail) ;;
    *)
      if [ -n "${reason[$name]+x}" ]; then
        echo "check_skips: $name $status (allowed: ${reason[$name]})"
        allowed=$((allowed + 1))
      else
        echo "check_skips: $name $status, and $allow does not allow it" >&2
        bad=$((bad + 1))
      fi ;;
  esac
done < <(grep -o '<testcase name="[^"]*"[^>]*status="[^"]*"' "$junit" |
         sed -E 's/<testcase name="([^"]*)".*status="([^"]*)"/\1\t\2/')
[ "$ran" -gt 0 ] || { echo "check_skips: no test results in $junit" >&2; exit 1; }
if [ "$bad" -gt 0 ]; then
  echo "check_skips: $bad of $ran tests did not run (see the test's output above for why)" >&2
  exit 1
fi
echo "check_skips: $((ran - allowed)) of $ran tests ran; $allowed skipped as $allow allows"
