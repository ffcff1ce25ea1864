#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs tierlm's main job: installs system packages, builds, and generates text
# with the embedded default model (profiles/models/tierlm-tiny). Extra arguments go to `tierlm run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTIERLM_BUILD_TESTS=OFF -DTIERLM_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target tierlm
./build/tierlm run --model profiles/models/tierlm-tiny --prompt "Return the number of" --max-tokens 48 "$@"
