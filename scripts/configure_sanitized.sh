#!/usr/bin/env bash
# Configures build-asan/: the whole project compiled by clang 14 with
# AddressSanitizer and UndefinedBehaviorSanitizer (-fno-sanitize-recover:
# any UB report fails), plus libFuzzer's coverage instrumentation
# (-fsanitize=fuzzer-no-link) and the fuzz targets (-DSERVESIM_FUZZ=ON).
# One build serves both scripts/test_sanitized.sh (the test suite) and
# scripts/fuzz.sh (the fuzz targets), so the sanitized libraries are
# compiled once (the comparison hooks only where a fuzz target explores:
# servesim_without_cmp_tracing in CMakeLists.txt). Line tables only for
# debug information: the sanitizers' reports name file and line, and the
# objects are half the size. Uses ccache when it is installed. Expects the
# packages of scripts/setup.sh --sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
flags="-O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link"
if [ ! -f build-asan/CMakeCache.txt ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Sanitized \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DSERVESIM_FUZZ=ON -DSERVESIM_TESTS=ON "${launcher[@]}" >/dev/null
fi
