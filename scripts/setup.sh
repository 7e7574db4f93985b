#!/usr/bin/env bash
# Idempotent set-up: installs the Debian 12 packages servesim needs (only the
# missing ones), then configures and builds Release into build/.
# Usage: scripts/setup.sh [--sanitizers] [--no-build]
#   (from anywhere; run as root, or with sudo available, when packages are
#   missing). --sanitizers also installs clang 14 with its libFuzzer, ASan
#   and UBSan runtimes (scripts/test_sanitized.sh, scripts/fuzz.sh);
#   --no-build stops after the packages.
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
sanitizers=0
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    --sanitizers) sanitizers=1 ;;
    *) echo "setup: unknown option $arg (expected --sanitizers, --no-build)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsimgrid-dev prometheus-cpp-dev libcivetweb-dev zlib1g-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  openssl iproute2  # device-agent tests: throw-away TLS certificates, network namespaces
)
[ "$sanitizers" -eq 1 ] && packages+=(clang-14 libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  scripts/apt_install.sh "${missing[@]}"
fi

[ "$build" -eq 1 ] || exit 0
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
