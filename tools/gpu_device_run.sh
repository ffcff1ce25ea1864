#!/usr/bin/env bash
# Runs the CUDA backend's checks and benchmarks on the device machine (see /work/shared/device/README.md).
# Here: build (the CUDA backend is on wherever nvcc exists: cmake --build build --target tierlm gpu_forward_test
# gpu_bench), then pack the stripped binaries and the non-system shared libraries (cuBLAS is not among them: it is
# opened with dlopen, and the device has it):
#   tools/gpu_device_run.sh pack      -> .devpack/devlibs.tar.xz (carry .devpack)
# There: tools/gpu_device_run.sh run  -> logs under $OUT (test1/2.log, san_*.log, cli.log, bench.log)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  rm -rf .devlibs && mkdir -p .devlibs .devpack
  for b in build/tierlm build/tests/gpu_forward_test build/bench/gpu_bench; do strip -o .devlibs/"$(basename "$b")" "$b"; done
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
ldd /tmp/devlibs/gpu_bench | grep -E "not found"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/device.log"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
# Correctness twice (a moving error is a race), then the sanitizers on a few small cases, then the benchmarks.
for i in 1 2; do
  timeout 100 /tmp/devlibs/gpu_forward_test 2>&1 | grep -vE '^\[ +(RUN|OK) ' > "$OUT/test$i.log"
  grep -E 'GPU-EXACT|PAGED-KV|PROBE|FAILED|PASSED' "$OUT/test$i.log" | cut -c1-160 | tail -14
done
cases='*StoredPrecisionMatchesExactMath/8:*Q8KvMatchesExactMath/0:*Q8MatchesExactMath/6:*StoredPrecisionMatchesExactMath/9:GpuPagedKv.*'
for tool in memcheck initcheck racecheck; do
  [ -n "$san" ] || { echo "no compute-sanitizer" > "$OUT/san_$tool.log"; continue; }
  timeout 90 "$san" --tool $tool --print-limit 20 /tmp/devlibs/gpu_forward_test --gtest_filter="$cases" \
    > "$OUT/san_$tool.log" 2>&1
  echo "$tool: rc $? $(grep -cE '^========= (Invalid|Uninitialized|Race|Error|.*hazard)' "$OUT/san_$tool.log") reports;" \
    "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1)"
done
timeout 30 /tmp/devlibs/tierlm run --model profiles/models/tierlm-tiny --prompt "Return the number of" -n 24 \
  --threads 1 --gpu-layers 99 > "$OUT/cli.log" 2>&1; tail -2 "$OUT/cli.log"
timeout 200 /tmp/devlibs/gpu_bench "$@" 2>&1 | tee "$OUT/bench.log"
