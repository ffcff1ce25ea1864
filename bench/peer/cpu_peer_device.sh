#!/usr/bin/env bash
# bench/peer/cpu_peer_device.sh — tierlm against llama.cpp on the device machine's CPU (16 cores; issue 18 item 2's
# 16-thread figures), same weights, interleaved, in one call. llama-bench is built there from node-llama-cpp 3.22.1's
# llama.cpp source (bench/peer/llamacpp_cuda.sh pack DIR makes DIR/llama-src.tar.xz) for the CPU only, with
# GGML_NATIVE=ON: the best build llama.cpp has for that CPU.
# Here: build tierlm_peer synthetic_hf gguf_export; BINARIES="build/bench/tierlm_peer build/bench/synthetic_hf
#   build/bench/gguf_export" STUB_BLAS=1 bash tools/gpu_device_run.sh pack (the f16/q8_0/q4 paths do not call BLAS on
#   an AVX-512 CPU); copy .devpack/devlibs.tar.xz, llama-src.tar.xz and this script into DIR (git-ignored), carry DIR.
# There: bash DIR/cpu_peer_device.sh -> $OUT/cpu-peer.jsonl (tierlm_peer lines and llama-bench JSON lines),
#   $OUT/log.txt. bench/peer/cpu_summary.py $OUT/cpu-peer.jsonl prints the table.
# Env: SHAPES ("1b"; "1b 8b" if time allows), THREADS ("16"), ROUNDS (2), PROMPT (128), DECODE (32), LIMIT_S (470),
#   FORMATS ("f16 q8_0 q4 q4k"), TIERLM_TIMEOUT (120 s a tierlm_peer process).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/cpu_out}
mkdir -p "$OUT" /tmp/devlibs && tar -C /tmp/devlibs -xJf "$D/devlibs.tar.xz"
export LD_LIBRARY_PATH=/tmp/devlibs:${LD_LIBRARY_PATH:-}
LIMIT_S=${LIMIT_S:-470}; PROMPT=${PROMPT:-128}; DECODE=${DECODE:-32}
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L3"; grep -o -w -E "avx512f|avx512_bf16|avx512_fp16|avx512_vnni|amx_bf16|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; free -g | head -2; nproc; } | tee "$OUT/log.txt"
if [ ! -x /tmp/llama-cpu/bin/llama-bench ]; then
  (rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src && tar -C /tmp/llama-src -xJf "$D/llama-src.tar.xz" &&
   LD_LIBRARY_PATH= cmake -S /tmp/llama-src -B /tmp/llama-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
     -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > /tmp/llama-cfg.log 2>&1 &&
   LD_LIBRARY_PATH= ninja -C /tmp/llama-cpu llama-bench > /tmp/llama-build.log 2>&1; echo $? > /tmp/llama-build.rc) &
fi
W=/tmp/peer; mkdir -p $W
for shape in ${SHAPES:-1b}; do
  n=$shape-l0
  [ -f $W/$n-hf/model.safetensors ] || /tmp/devlibs/synthetic_hf $W/$n-hf --shape $shape --layers 0 > /dev/null
  for q in q4_0 q4_k q8_0 f16; do [ -f $W/$n-$q.gguf ] || /tmp/devlibs/gguf_export $W/$n-hf $W/$n-$q.gguf $q > /dev/null & done; wait
  echo "folder + GGUFs $n at $(el) s" | tee -a "$OUT/log.txt"
done
while [ ! -f /tmp/llama-build.rc ]; do sleep 2; done
echo "llama-bench build rc $(cat /tmp/llama-build.rc) at $(el) s" | tee -a "$OUT/log.txt"
[ "$(cat /tmp/llama-build.rc)" = 0 ] || { tail -20 /tmp/llama-cfg.log /tmp/llama-build.log | tee -a "$OUT/log.txt"; exit 1; }
gg() { case $1 in q4) echo q4_0;; q4k) echo q4_k;; *) echo $1;; esac; }  # q4k: tierlm q4 against Q4_K
tf() { case $1 in q4k) echo q4;; *) echo $1;; esac; }
# Same model: greedy tokens from the f16 weights (tierlm_peer prints them; llama-bench does not generate text, so
# the token check is bench/peer.sh's job here on the dev machine; this script checks the files are the same sizes).
for r in $(seq ${ROUNDS:-2}); do
  for shape in ${SHAPES:-1b}; do
    n=$shape-l0
    for t in ${THREADS:-16}; do
      for f in ${FORMATS:-f16 q8_0 q4 q4k}; do
        [ "$(el)" -gt "$LIMIT_S" ] && { echo "stopped at $(el) s (round $r $n $t $f)" | tee -a "$OUT/log.txt"; break 4; }
        echo "round $r $n t$t $f at $(el) s" >> "$OUT/log.txt"
        timeout ${TIERLM_TIMEOUT:-120} /tmp/devlibs/tierlm_peer $W/$n-hf $(tf $f) $t $PROMPT $DECODE 2>>"$OUT/tierlm.err" |
          sed "s/^{/{\"shape\":\"$shape\",\"round\":$r,/; s/\"format\":\"[^\"]*\"/\"format\":\"$f\"/" |
          tee -a "$OUT/cpu-peer.jsonl"
        timeout 150 /tmp/llama-cpu/bin/llama-bench -m $W/$n-$(gg $f).gguf -t $t -p $PROMPT -n $DECODE -r 3 -o jsonl \
          2>>"$OUT/llama.err" | python3 -c "import sys,json
for l in sys.stdin:
  d=json.loads(l); print(json.dumps({'shape':'$shape','round':$r,'engine':'llama.cpp','format':'$f','threads':d['n_threads'],
    'kind':'prefill' if d['n_prompt'] else 'decode','tps':d['avg_ts'],'stddev':d['stddev_ts'],'cpu':d.get('cpu_info','')}))" |
          tee -a "$OUT/cpu-peer.jsonl"
      done
    done
  done
done
echo "end at $(el) s" | tee -a "$OUT/log.txt"
