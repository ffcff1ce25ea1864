#!/usr/bin/env bash
# bench/peer/gpu_peer_device.sh — tierlm against llama.cpp CUDA on the device machine, same weights, one run.
# Here: build gpu_bench synthetic_hf gguf_export (and the GPU tests for STEPS=tests), then
#   BINARIES="build/bench/gpu_bench build/bench/synthetic_hf build/bench/gguf_export build/tests/gpu_kernels_test
#   build/tests/gpu_forward_test build/tests/scheduler_gpu_test" STUB_BLAS=1 bash tools/gpu_device_run.sh pack
#   bench/peer/llamacpp_cuda.sh pack DIR; copy .devpack/devlibs.tar.xz and this script into DIR too (a folder of the
#   checkout that git ignores) and carry DIR. There: bash DIR/gpu_peer_device.sh (logs and JSON lines under $OUT;
#   bench/peer/gpu_summary.py OUT/peer.jsonl prints the table; the other logs come back as OUT/logs.tgz).
# STEPS (default "llama ab peer"):
#  llama: build llama-bench in the background (bench/peer/llamacpp_cuda.sh build, nice 19)
#  (peer) synthetic HF folders of SHAPES (default "1b 8b") and GGUF f16/q8_0/q4_0 from each, in the background
#  tests: gpu_kernels_test, gpu_forward_test, scheduler_gpu_test
#  ab:    gpu_bench $AB_ARGS once per AB_ENVS entry (the matvec A/B; none when AB_ARGS is unset), then AB_MODEL_ENVS
#         runs of gpu_bench --model on the last shape
#  peer:  per shape: tierlm (gpu_bench --model, every layer and the head on the GPU); once llama-bench is built:
#         llama-bench on the GGUFs, then tierlm again (a second round)
# LIMIT_S: no new step starts after this many seconds (default 430). GGUF_FORMATS: the GGUFs written and run
# (default "q4_0 q8_0 f16"); TIERLM_FORMATS: gpu_bench --formats (default f16,q8_0,q4); TIERLM_PEER_PROFILE=1 adds
# gpu_bench's per-operation profile (stderr, $OUT/gpu_bench.err); TIERLM_TIMEOUT: seconds a gpu_bench process may
# take (default 200; an 8B format loads and converts 16 GB first); SECOND_ROUND=0: tierlm once, before llama.cpp.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/devlibs && tar -C /tmp/devlibs -xJf "$D/devlibs.tar.xz"
src=$(cat /tmp/devlibs/SOURCE_DIR 2>/dev/null || true)
if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
cublas=$(find /usr/local/cuda* /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=/tmp/devlibs:/usr/local/cuda/lib64:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a "$OUT/log.txt"
STEPS=${STEPS:-llama ab peer}; LIMIT_S=${LIMIT_S:-430}
has() { [[ " $STEPS " == *" $1 "* ]]; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
late() { [ "$(el)" -gt "$LIMIT_S" ] && { echo "skipped ($1): $(el) s > $LIMIT_S s" | tee -a "$OUT/log.txt"; return 0; }; return 1; }
if has llama && [ ! -x /tmp/llama-build/bin/llama-bench ]; then
  (LD_LIBRARY_PATH= setsid nice -n 19 bash bench/peer/llamacpp_cuda.sh build "$D" > /tmp/llama-build.out 2>&1; echo $? > /tmp/llama-build.rc) &
fi
W=/tmp/peer; mkdir -p $W
names=""
for s in ${SHAPES:-1b 8b}; do
  shape=${s%%:*}; layers=0; [ "$s" != "$shape" ] && layers=${s#*:}; names="$names $shape-l$layers"
done
if has peer || has ab; then
  (for s in ${SHAPES:-1b 8b}; do
     shape=${s%%:*}; layers=0; [ "$s" != "$shape" ] && layers=${s#*:}; n=$shape-l$layers
     [ -f $W/$n-hf/model.safetensors ] || nice -n 10 /tmp/devlibs/synthetic_hf $W/$n-hf --shape $shape --layers $layers
     touch $W/$n.hf-done
     for q in ${GGUF_FORMATS:-q4_0 q8_0 f16}; do [ -f $W/$n-$q.gguf ] || nice -n 10 /tmp/devlibs/gguf_export $W/$n-hf $W/$n-$q.gguf $q > /dev/null & done; wait
     echo "folder + GGUFs $n at $(el) s: $(du -sh $W | cut -f1)" >> "$OUT/log.txt"; touch $W/$n.done
   done) &
fi
tierlm() {  # FILE shape-layers [env...]
  late "tierlm $2" && return
  while [ ! -f $W/$2.hf-done ]; do sleep 1; done
  echo "=== tierlm $2 at $(el) s ${*:3}" | tee -a "$OUT/$1"
  env "${@:3}" timeout ${TIERLM_TIMEOUT:-200} /tmp/devlibs/gpu_bench --model $W/$2-hf --formats ${TIERLM_FORMATS:-f16,q8_0,q4} --prompt 180 --long 1800 --decode 128 2>>"$OUT/gpu_bench.err" | tee -a "$OUT/$1"
}
llama() {
  while [ ! -f /tmp/llama-build.rc ] || [ ! -f $W/$1.done ]; do sleep 2; done
  [ "$(cat /tmp/llama-build.rc)" = 0 ] || { echo "llama build failed"; tail -20 /tmp/llama-build.out /tmp/llama-build.log | tee -a "$OUT/log.txt"; return; }
  for q in ${GGUF_FORMATS:-f16 q8_0 q4_0}; do
    late "llama $1 $q" && return
    echo "=== llama.cpp $1 $q at $(el) s" | tee -a "$OUT/peer.jsonl"
    LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 150 /tmp/llama-build/bin/llama-bench -m $W/$1-$q.gguf -ngl 99 -fa 1 -p 180,1800 -n 128 -r 3 -o jsonl 2>>"$OUT/llama.err" | tee -a "$OUT/peer.jsonl" | python3 -c "import sys,json
for l in sys.stdin:
  d=json.loads(l); print('llama.cpp', d['model_type'], d['model_size'], 'pp', d['n_prompt'], 'tg', d['n_gen'], round(d['avg_ts'],1), '+-', round(d['stddev_ts'],1))"
  done
}
if has ab && [ -n "${AB_ARGS+set}" ]; then  # AB_ENVS: one gpu_bench $AB_ARGS per entry ("-" none, else VAR=VAL,VAR=VAL)
  for e in ${AB_ENVS:--}; do
    late "ab $e" && break
    echo "=== gpu_bench $AB_ARGS with $e" | tee -a "$OUT/ab.log"
    env $([ "$e" = - ] || echo "$e" | tr ',' ' ') timeout ${AB_TIMEOUT:-200} /tmp/devlibs/gpu_bench $AB_ARGS 2>&1 | tee -a "$OUT/ab.log"
  done
  echo "ab done at $(el) s"
fi
if has tests; then
  timeout 60 /tmp/devlibs/gpu_kernels_test 2>&1 | grep -vE '^\[ +(RUN|OK) ' > "$OUT/kernels.log"; grep -E "FAILED|PASSED|Failure" "$OUT/kernels.log" | tail -8
  env ${TEST_ENV:-} timeout 200 /tmp/devlibs/gpu_forward_test 2>&1 | grep -vE '^\[ +(RUN|OK) ' > "$OUT/forward.log"; grep -E "FAILED|PASSED|Failure|Which is" "$OUT/forward.log" | cut -c1-200 | tail -12
  env ${TEST_ENV:-} timeout 120 /tmp/devlibs/scheduler_gpu_test > "$OUT/scheduler_gpu.log" 2>&1; tail -3 "$OUT/scheduler_gpu.log"
  echo "tests done at $(el) s"
fi
if has peer; then
  for n in $names; do tierlm peer.jsonl $n; llama $n; [ "${SECOND_ROUND:-1}" = 0 ] || tierlm peer.jsonl $n; done
fi
if has ab; then  # end-to-end variants on the last shape's folder (e.g. "TIERLM_GPU_PACKED_PANELS=4,TIERLM_GPU_PACKED_MMA=all")
  for e in ${AB_MODEL_ENVS:-}; do tierlm ab_model.jsonl ${names##* } $(echo $e | tr ',' ' '); done
fi
echo "end at $(el) s"
# A device call returns at most 8 files from $OUT: the logs go into one archive beside the JSON lines the tables are
# made from (a call of session 35 lost peer.jsonl to that limit). console.txt stays for the caller's redirection.
(cd "$OUT" && logs=$(ls | grep -vE '^(peer\.jsonl|ab_model\.jsonl|log\.txt|console\.txt|logs\.tgz)$') &&
   [ -n "$logs" ] && tar -czf logs.tgz $logs && rm -f $logs)
