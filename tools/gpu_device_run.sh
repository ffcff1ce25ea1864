#!/usr/bin/env bash
# Runs the CUDA backend's checks and benchmarks on the device machine (see /work/shared/device/README.md).
# Here: build with CUDA (build-cuda), then pack the stripped binaries and the non-system shared libraries:
#   tools/gpu_device_run.sh pack      -> .devpack/devlibs.tar.xz (carry .devpack)
# There: tools/gpu_device_run.sh run  -> logs under $OUT (test.log, bench.log, cli.log)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  rm -rf .devlibs && mkdir -p .devlibs .devpack
  for b in build-cuda/tierlm build-cuda/tests/gpu_forward_test build-cuda/bench/gpu_bench; do strip -o .devlibs/"$(basename "$b")" "$b"; done
  ldd .devlibs/* | awk '/=>/{print $3}' | sort -u | grep -vE 'libc\.so|libm\.so|libdl|libpthread|librt|libgcc_s|libstdc|/usr/local/cuda|ld-linux' |
    while read -r lib; do cp -L "$lib" .devlibs/; done
  strip .devlibs/*.so* 2>/dev/null
  tar -C .devlibs -cf - . | xz -T2 -6 > .devpack/devlibs.tar.xz
  ls -la .devpack
  exit 0
fi
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/devlibs && tar -C /tmp/devlibs -xJf .devpack/devlibs.tar.xz
cublas=$(find /usr/local/cuda* /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=/tmp/devlibs:/usr/local/cuda/lib64:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}
ldd /tmp/devlibs/gpu_bench | grep -E 'not found|cublas' | tee "$OUT/ldd.log"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/device.log"
timeout 150 /tmp/devlibs/gpu_forward_test 2>&1 | grep -vE '^\[ +(RUN|OK) ' | tee "$OUT/test.log" | tail -60
timeout 30 /tmp/devlibs/tierlm run --model profiles/models/tierlm-tiny --prompt "Return the number of" -n 24 \
  --threads 1 --gpu-layers 99 2>&1 | tee "$OUT/cli.log"
timeout 240 /tmp/devlibs/gpu_bench "$@" 2>&1 | tee "$OUT/bench.log"
