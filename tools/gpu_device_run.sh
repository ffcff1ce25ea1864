#!/usr/bin/env bash
# Runs the CUDA backend's checks and benchmarks on the device machine (see /work/shared/device/README.md).
# Here: build (the CUDA backend is on wherever nvcc exists: cmake --build build --target tierlm gpu_forward_test
# gpu_bench), then pack the stripped binaries and the non-system shared libraries (cuBLAS is not among them: it is
# opened with dlopen, and the device has it):
#   tools/gpu_device_run.sh pack      -> .devpack/devlibs.tar.xz (carry .devpack); BINARIES="build/bench/gpu_bench
#   ..." packs only those (a quicker build when the others are not needed); STUB_BLAS=1 carries a plain
#   cblas_sgemm instead of OpenBLAS (tools/device_cblas_stub.c), when the checkout leaves too little of the 64 MiB;
#   STUB_ICU=1 an empty ICU data library (benches that never touch text);
#   the tracked tree alone is ~64 MB: `bash tools/device_slim.sh on` before the run call, `off` right after
# There: tools/gpu_device_run.sh run  -> logs under $OUT (test1/2.log, kernels.log, sanitizers.log, cli.log,
#        scheduler_gpu.log, serve.log, bench.log); QUICK=1: one test pass, no sanitizers, no benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  rm -rf .devlibs && mkdir -p .devlibs .devpack
  for b in ${BINARIES:-build/tierlm build/tests/gpu_forward_test build/tests/gpu_kernels_test build/tests/scheduler_gpu_test build/bench/gpu_bench}; do strip -o .devlibs/"$(basename "$b")" "$b"; done
  ldd .devlibs/* | awk '/=>/{print $3}' | sort -u | grep -vE 'libc\.so|libm\.so|libdl|libpthread|librt|libgcc_s|libstdc|/usr/local/cuda|ld-linux' |
    while read -r lib; do cp -L "$lib" .devlibs/; done
  strip .devlibs/*.so* 2>/dev/null
  # The tests find their fixtures under the source folder they were built in (TIERLM_SOURCE_DIR, e.g. a worktree):
  # the device links it to its checkout (see below).
  pwd > .devlibs/SOURCE_DIR
  if [ "${STUB_BLAS:-0}" = 1 ]; then  # see tools/device_cblas_stub.c: a ~2 MB carry instead of ~10 MB
    rm -f .devlibs/libopenblas.so.0 .devlibs/libgfortran.so.5 .devlibs/libquadmath.so.0
    gcc -O3 -shared -fPIC -Wl,-soname,libopenblas.so.0 -o .devlibs/libopenblas.so.0 tools/device_cblas_stub.c
  fi
  if [ "${STUB_ICU:-0}" = 1 ] && [ -f .devlibs/libicudata.so.72 ]; then
    # ICU's data library is 31 MB (7.5 MB packed); a binary that never converts or breaks text (the benches on
    # synthetic token ids) only needs its one symbol to load. ICU reports missing data if something does use it.
    echo 'const char icudt72_dat[64] = {0};' > /tmp/icudata_stub.c
    gcc -shared -fPIC -Wl,-soname,libicudata.so.72 -o .devlibs/libicudata.so.72 /tmp/icudata_stub.c
  fi
  tar -C .devlibs -cf - . | xz -T2 -9 > .devpack/devlibs.tar.xz
  ls -la .devpack
  exit 0
fi
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/devlibs && tar -C /tmp/devlibs -xJf .devpack/devlibs.tar.xz
src=$(cat /tmp/devlibs/SOURCE_DIR 2>/dev/null || true)
if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
cublas=$(find /usr/local/cuda* /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=/tmp/devlibs:/usr/local/cuda/lib64:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}
# The carried libraries (our Debian libcurl among them) must not reach the device's own tools: its curl needs its
# own, newer libcurl.
curl() { LD_LIBRARY_PATH= command curl "$@"; }
ldd /tmp/devlibs/gpu_bench | grep -E "not found"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee /tmp/device.log
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
# Correctness twice (a moving error is a race), then the sanitizers on a few small cases, then the benchmarks.
timeout 60 /tmp/devlibs/gpu_kernels_test 2>&1 | grep -vE '^\[ +(RUN|OK) ' > "$OUT/kernels.log"
grep -E "Failure|Which is|FAILED|PASSED|error" "$OUT/kernels.log" | head -30
# QUICK=1: one correctness pass, no sanitizers, no benchmarks.
for i in $([ "${QUICK:-0}" = 1 ] && echo 1 || echo 1 2); do
  timeout 200 /tmp/devlibs/gpu_forward_test 2>&1 | grep -vE '^\[ +(RUN|OK) ' > "$OUT/test$i.log"
  grep -E "GPU-EXACT|PAGED-KV|STAGING|MOE-ROUTE|PROBE|FAILED|PASSED|Failure" "$OUT/test$i.log" | grep -vE "top-1 same ([0-9]+)/\1 \(" | cut -c1-200 | tail -40
done
cases='*StoredPrecisionMatchesExactMath/8:*Q8KvMatchesExactMath/0:*Q8MatchesExactMath/6:*StoredPrecisionMatchesExactMath/9:GpuPagedKv.*'
for tool in $([ "${QUICK:-0}" = 1 ] || echo memcheck initcheck racecheck); do
  [ -n "$san" ] || { echo "no compute-sanitizer" >> "$OUT/sanitizers.log"; continue; }
  timeout 90 "$san" --tool $tool --print-limit 20 /tmp/devlibs/gpu_forward_test --gtest_filter="$cases" \
    > "/tmp/san_$tool.log" 2>&1
  echo "$tool: rc $? $(grep -cE '^========= (Invalid|Uninitialized|Race|Error|.*hazard)' "/tmp/san_$tool.log") reports;" \
    "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "/tmp/san_$tool.log" | tail -1)"
  { echo "== $tool"; head -c 200000 "/tmp/san_$tool.log"; } >> "$OUT/sanitizers.log"
done
timeout 30 /tmp/devlibs/tierlm run --model profiles/models/tierlm-tiny --prompt "Return the number of" -n 24 \
  --threads 1 --gpu-layers 99 --no-wisdom > "$OUT/cli.log" 2>&1; tail -2 "$OUT/cli.log"
timeout 60 /tmp/devlibs/scheduler_gpu_test > "$OUT/scheduler_gpu.log" 2>&1; tail -3 "$OUT/scheduler_gpu.log"
# serve with every layer on the GPU: one greedy completion over loopback, then its /health and GPU metrics.
/tmp/devlibs/tierlm serve --model profiles/models/tierlm-tiny --port 18080 --threads 2 --gpu-layers 99 --no-wisdom \
  > /tmp/serve.log 2>&1 &
spid=$!
for _ in $(seq 50); do curl -sf http://127.0.0.1:18080/health > /dev/null && break; sleep 0.2; done
curl -s http://127.0.0.1:18080/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt": "Return the number of", "max_tokens": 24, "temperature": 0}' | tee /tmp/serve_completion.json; echo
curl -s http://127.0.0.1:18080/health > /tmp/serve_health.json; grep -o '"gpu":{[^}]*}' /tmp/serve_health.json
curl -s http://127.0.0.1:18080/metrics | grep '^tierlm_gpu' | head -12 | tee /tmp/serve_metrics.txt
kill $spid; wait $spid 2>/dev/null
cat /tmp/serve.log /tmp/serve_completion.json /tmp/serve_health.json /tmp/serve_metrics.txt > "$OUT/serve.log"
echo "profilers: $(command -v nsys || ls /usr/local/cuda*/bin/nsys 2>/dev/null | head -1) $(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
shift || true
[ "${QUICK:-0}" = 1 ] && exit 0
timeout 240 /tmp/devlibs/gpu_bench "$@" 2>&1 | tee "$OUT/bench.log"
# A process's first prompt (180 tokens) next to the steady prefill (180 and 1800), one fresh process per format.
for f in f16 q8_0 q4; do
  timeout 90 /tmp/devlibs/gpu_bench --first-use $f 2>&1 | grep -E "first use|constructor|warm-up|prefill of" | tee -a "$OUT/bench.log"
done
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -n "$nsys" ] && [ "${PROFILE:-1}" = 1 ]; then  # device time per kernel of the bf16 llama runs
  timeout 150 "$nsys" profile -o "$OUT/nsys" --force-overwrite true /tmp/devlibs/gpu_bench --dense-only --quick > /dev/null 2>&1
  timeout 100 "$nsys" stats -r cuda_gpu_kern_sum -f csv "$OUT/nsys.nsys-rep" 2>/dev/null | cut -c1-220 | head -40 > /tmp/kernels.csv
  rm -f "$OUT"/nsys.nsys-rep "$OUT"/nsys.sqlite; cat /tmp/kernels.csv >> "$OUT/bench.log"; head -30 /tmp/kernels.csv
fi
