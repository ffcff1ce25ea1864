#!/usr/bin/env bash
# bench/peer/moe_peer_device.sh — tierlm against llama.cpp on the device machine's CPU for the Qwen3-30B-A3B MoE shape
# held wholly in RAM (issue 18 item 1's MoE row): LAYERS (default 24) of its 48 layers at the published per-layer
# shape, written there by synthetic_mlx_moe as a user's mlx-community 4-bit folder; tierlm runs that folder as stored
# (tierlm_peer DIR stored: every expert resident), llama.cpp runs gguf_export --from-mlx's qwen3moe GGUF of the same
# codes (Q4_1) through llama-bench, built there from node-llama-cpp 3.22.1's source for the CPU with GGML_NATIVE=ON.
# Same threads, interleaved, after each engine's warm-up.
# Here: build tierlm_peer gguf_export synthetic_mlx_moe; BINARIES="build/bench/tierlm_peer build/bench/gguf_export
#   build/bench/synthetic_mlx_moe" bash tools/gpu_device_run.sh pack; into DIR (git-ignored) copy
#   .devpack/devlibs.tar.xz, llama-src.tar.xz (bench/peer/llamacpp_cuda.sh pack DIR), qwen3.tar.xz (tar -C
#   .cache/tokenizers -cJf DIR/qwen3.tar.xz qwen3; tools/fetch_tokenizers.sh) and this script; carry DIR.
# There: bash DIR/moe_peer_device.sh -> $OUT/moe-peer.jsonl (tierlm_peer lines; llama-bench lines), $OUT/log.txt.
# Env: LAYERS (24), T (16 threads), ROUNDS (2), PROMPTS ("128 512"), DECODE (32), LIMIT_S (540), APART ("0"; "0 1"
# adds a tierlm run whose decode rows run their resident experts one after another: the A/B of
# MoeBlock::set_row_experts_together). One call: the machine is given back when idle, and the folder, the GGUF and
# llama-bench live in its /tmp.
set -u
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LAYERS=${LAYERS:-8}; T=${T:-16}
t0=$SECONDS; el() { echo $((SECONDS - t0)); }
mkdir -p /tmp/dl && tar -C /tmp/dl -xJf "$D/devlibs.tar.xz"
export CUDA_VISIBLE_DEVICES=
{ lscpu | grep -E "Model name|^CPU\(s\)"; free -g | head -2; } | tee "$OUT/log.txt"
if [ ! -x /tmp/llama-cpu/bin/llama-bench ]; then
  (rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src && tar -C /tmp/llama-src -xJf "$D/llama-src.tar.xz" &&
   cmake -S /tmp/llama-src -B /tmp/llama-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
     -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > /tmp/llama-cfg.log 2>&1 &&
   ninja -C /tmp/llama-cpu llama-bench > /tmp/llama-build.log 2>&1; echo $? > /tmp/llama-build.rc) &
fi
M=/tmp/q3-l$LAYERS
if [ ! -f $M.gguf ]; then
  mkdir -p /tmp/tok && tar -C /tmp/tok -xJf "$D/qwen3.tar.xz"
  LD_LIBRARY_PATH=/tmp/dl /tmp/dl/synthetic_mlx_moe $M --tokenizer /tmp/tok/qwen3 --layers $LAYERS > "$OUT/synth.log" 2>&1
  echo "folder at $(el) s: $(du -sh $M | cut -f1)" | tee -a "$OUT/log.txt"
  LD_LIBRARY_PATH=/tmp/dl /tmp/dl/gguf_export --from-mlx $M $M.gguf > "$OUT/gguf.log" 2>&1
  echo "gguf rc $? at $(el) s: $(du -sh $M.gguf | cut -f1)" | tee -a "$OUT/log.txt"
fi
while [ ! -f /tmp/llama-build.rc ]; do sleep 2; done
echo "llama-bench build rc $(cat /tmp/llama-build.rc) at $(el) s" | tee -a "$OUT/log.txt"
[ "$(cat /tmp/llama-build.rc)" = 0 ] || { tail -20 /tmp/llama-cfg.log /tmp/llama-build.log | tee -a "$OUT/log.txt"; exit 1; }
for r in $(seq ${ROUNDS:-2}); do
  for p in ${PROMPTS:-128 512}; do
    [ "$(el)" -gt "${LIMIT_S:-540}" ] && { echo "stopped at $(el) s" | tee -a "$OUT/log.txt"; break 2; }
    for apart in ${APART:-0}; do  # APART="0 1": also a decode row's resident experts one after another (the old way)
      TIERLM_PEER_ROW_EXPERTS_APART=$apart LD_LIBRARY_PATH=/tmp/dl timeout 150 /tmp/dl/tierlm_peer $M stored $T $p \
        ${DECODE:-32} 2>>"$OUT/tierlm.err" | sed "s/^{/{\"round\":$r,\"apart\":$apart,/" | tee -a "$OUT/moe-peer.jsonl"
    done
    timeout 150 /tmp/llama-cpu/bin/llama-bench -m $M.gguf -t $T -p $p -n ${DECODE:-32} -r 3 -o jsonl \
      2>>"$OUT/llama.err" | python3 -c "import sys,json
for l in sys.stdin:
  d=json.loads(l); print(json.dumps({'round':$r,'engine':'llama.cpp','threads':d['n_threads'],'prompt_tokens':d['n_prompt'],
    'kind':'prefill' if d['n_prompt'] else 'decode','tps':d['avg_ts'],'stddev':d['stddev_ts'],'type':d.get('model_type','')}))" |
      tee -a "$OUT/moe-peer.jsonl"
  done
done
echo "end at $(el) s" | tee -a "$OUT/log.txt"
