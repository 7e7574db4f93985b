#!/usr/bin/env bash
# Installs Debian packages for the set-up scripts (scripts/setup.sh,
# scripts/setup_dashboard_tests.sh): as root, or through sudo where that is
# available. A package manager left half-way by an earlier install that was
# killed (dpkg "was interrupted") is finished first with `dpkg --configure -a`:
# without that, apt-get refuses every install on the machine. The package
# lists are updated once, then the packages are installed together, or with
# --each one by one and without recommended packages, so that one unavailable
# package does not block the others.
# Exits 1 when a package could not be installed (with --each: after trying all).
# Usage: scripts/apt_install.sh [--each] PACKAGE...
set -uo pipefail
each=0
if [ "${1:-}" = "--each" ]; then each=1; shift; fi
[ $# -gt 0 ] || exit 0

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "apt_install: not root and no sudo: cannot install $*" >&2
    exit 1
  fi
  as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
wait_lock=(-o DPkg::Lock::Timeout=600)

# `dpkg --audit` prints the packages left unpacked or half configured.
if [ -n "$("${as_root[@]}" dpkg --audit 2>/dev/null)" ]; then
  echo "apt_install: an earlier install was interrupted: dpkg --configure -a"
  "${as_root[@]}" dpkg --force-confdef --force-confold --configure -a >/dev/null ||
    echo "apt_install: dpkg --configure -a failed" >&2
fi
# The package lists may be missing or stale (a fresh container): update once.
"${as_root[@]}" apt-get -qq "${wait_lock[@]}" update >/dev/null ||
  echo "apt_install: apt-get update failed" >&2

install() {
  "${as_root[@]}" apt-get -qq "${wait_lock[@]}" install -y "$@" >/dev/null
}
if [ "$each" -eq 0 ]; then
  install "$@" || { echo "apt_install: could not install $*" >&2; exit 1; }
  exit 0
fi
failed=0
for p in "$@"; do
  # --no-install-recommends keeps chromium and prometheus lean (the dashboard
  # tests need neither a desktop nor the node exporter).
  if ! install --no-install-recommends "$p"; then
    echo "apt_install: could not install $p" >&2
    failed=1
  fi
done
exit "$failed"
