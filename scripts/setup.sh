#!/usr/bin/env bash
# Idempotent set-up: installs the Debian 12 packages servesim needs (only the
# missing ones), then configures Release into build/ and builds.
# Usage: scripts/setup.sh [--tests] [--sanitizers] [--no-build] [--target T]...
#   (from anywhere; run as root, or with sudo available, when packages are
#   missing)
#   (no option)   the servesim and servesim-agent programs
#   --target T    only target T (repeatable): scripts/run.sh builds servesim
#   --tests       also GoogleTest, Google Benchmark and the tools the tests
#                 use (openssl, iproute2); builds everything, tests and
#                 benchmarks included
#   --sanitizers  also clang 14 with its libFuzzer, ASan and UBSan runtimes
#                 (scripts/test_sanitized.sh, scripts/fuzz.sh); implies the
#                 test packages
#   --no-build    stop after the packages
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
tests=0
sanitizers=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0; shift ;;
    --tests) tests=1; shift ;;
    --sanitizers) sanitizers=1; tests=1; shift ;;
    --target) [ $# -ge 2 ] || { echo "setup: --target needs a target name" >&2; exit 2; }
              targets+=("$2"); shift 2 ;;
    *) echo "setup: unknown option $1 (expected --tests, --sanitizers, --no-build, --target T)" >&2
       exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsimgrid-dev prometheus-cpp-dev libcivetweb-dev zlib1g-dev
)
[ "$tests" -eq 1 ] && packages+=(
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
# ccache, where installed, keeps rebuilds after a branch switch short.
launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=)
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
if [ "$tests" -eq 1 ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSERVESIM_TESTS=ON "${launcher[@]}" >/dev/null
  cmake --build build -j"$jobs"
else
  # The tests are configured where GoogleTest is installed (SERVESIM_TESTS
  # AUTO), but only the programs are built.
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
  [ ${#targets[@]} -gt 0 ] || targets=(servesim servesim-agent)
  cmake --build build -j"$jobs" --target "${targets[@]}"
fi
