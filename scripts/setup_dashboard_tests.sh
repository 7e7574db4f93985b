#!/usr/bin/env bash
# Idempotent set-up for the live-dashboard tests (ctest labels browser,
# dashboards, prometheus): installs the missing Debian packages among chromium,
# prometheus, nodejs, npm and python3, then `npm ci` in tests/browser (playwright-core,
# pinned by its package-lock.json) unless that is already in place.
# Quiet when there is nothing to do. Runs as root, or with sudo available when
# packages are missing (scripts/apt_install.sh). Debian 12's own nodejs (18)
# and npm are enough: the pinned playwright-core is the last release for
# Node 18. A package or the npm install that fails is reported on stderr, the
# rest of the set-up still runs, and the script exits 1: the tests would
# otherwise skip, which scripts/check_skips.sh refuses anyway.
# Usage: scripts/setup_dashboard_tests.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in chromium prometheus; do installed "$p" || missing+=("$p"); done
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v python3 >/dev/null 2>&1 || missing+=(python3)

warned=0
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup_dashboard_tests: installing ${missing[*]}"
  # Debian's prometheus package starts a service where systemd runs; the tests
  # start their own server on a free loopback port and need neither.
  scripts/apt_install.sh --each "${missing[@]}" || warned=1
fi

# playwright-core for tests/browser/dashboard_test.js (no browser download:
# the test drives Debian's /usr/bin/chromium).
if command -v npm >/dev/null 2>&1; then
  want=$(node -p "require('./tests/browser/package-lock.json').packages['node_modules/playwright-core'].version" 2>/dev/null)
  have=$(node -p "require('./tests/browser/node_modules/playwright-core/package.json').version" 2>/dev/null)
  if [ -z "$want" ] || [ "$want" != "$have" ]; then
    echo "setup_dashboard_tests: npm ci in tests/browser (playwright-core ${want:-?})"
    if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null; then
      echo "setup_dashboard_tests: npm ci failed in tests/browser" >&2
      warned=1
    fi
  fi
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup_dashboard_tests: npm not found: cannot install playwright-core" >&2
  warned=1
fi
if [ "$warned" -ne 0 ]; then
  echo "setup_dashboard_tests: FAILED (see above): the dashboard tests cannot run on this machine" >&2
  exit 1
fi
exit 0
