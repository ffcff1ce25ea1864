#!/usr/bin/env bash
# bench/peer/hybrid_moe_device.sh — issue 18 item 4 on the device machine: the Qwen3-30B-A3B shape with its VRAM
# limited, tierlm's planned hybrid placement (calibrate --gpu-memory: every layer's attention and the hottest experts
# in VRAM, the other experts on the CPU in decode steps, copied into VRAM slots in prefill) against the same plan
# with every outside expert copied (TIERLM_GPU_CPU_EXPERT_ROWS=0), and llama.cpp CUDA (llama-bench -ngl 99 -fa 1)
# at each --n-cpu-moe of NCMOE, each process's peak device memory sampled with nvidia-smi every 100 ms.
# The model: synthetic_mlx_moe writes LAYERS of the 48 layers at the published per-layer shape as a user's
# mlx-community 4-bit folder; gguf_export --from-mlx writes the same codes as a qwen3moe Q4_1 GGUF for llama.cpp.
# Here: build tierlm synthetic_mlx_moe gguf_export gpu_forward_test; BINARIES="build/tierlm
#   build/bench/synthetic_mlx_moe build/bench/gguf_export build/tests/gpu_forward_test" bash
#   tools/gpu_device_run.sh pack; into DIR (git-ignored) copy .devpack/devlibs.tar.xz, llama-src.tar.xz
#   (bench/peer/llamacpp_cuda.sh pack DIR), qwen3.tar.xz (tar -C .cache/tokenizers -cJf DIR/qwen3.tar.xz qwen3) and
#   this script; carry DIR (~26 MB: first `bash tools/device_slim.sh on profiles/models/tierlm-tiny` plus the
#   fixture folders the MoE GPU tests do not read, `off` after). There: bash DIR/hybrid_moe_device.sh ->
#   $OUT/hybrid.jsonl, $OUT/log.txt. A second call while the machine is warm reuses /tmp (folder, GGUF, llama-bench,
#   wisdom); two calls were needed for the 24-layer run with the llama.cpp build (STEPS="tests llama" NCMOE="", then
#   the runs), one for 48 layers on a machine that still had llama-bench.
# Env: STEPS ("tests tierlm llama"), LAYERS (24), GPU_GIB (VRAM caps in GiB, one plan each; "4": 8 GiB scaled to
# the layers), COPY_AB (1: each plan also with copies, TIERLM_GPU_CPU_EXPERT_ROWS=0), PROMPT_TOKENS (~128),
# DECODE (64), NCMOE ("12 14 16 18"), ROUNDS (2), T (16), LIMIT_S (540: no step starts after it), WAIT_BUILD (1:
# calibrate only once llama-bench is built, so its probes do not share the CPU with the build). The machine
# keeps /tmp while warm: a second call finds the folder, the GGUF, llama-bench and the wisdom there.
set -u
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LAYERS=${LAYERS:-24}; GPU_GIB=${GPU_GIB:-4}; T=${T:-16}; DECODE=${DECODE:-64}; STEPS=${STEPS:-tests tierlm llama}
t0=$SECONDS; el() { echo $((SECONDS - t0)); }
has() { [[ " $STEPS " == *" $1 "* ]]; }
late() { [ "$(el)" -gt "${LIMIT_S:-540}" ] && { echo "skipped $1 at $(el) s" | tee -a "$OUT/log.txt"; return 0; }; return 1; }
mkdir -p /tmp/dl && tar -C /tmp/dl -xJf "$D/devlibs.tar.xz"
src=$(cat /tmp/dl/SOURCE_DIR 2>/dev/null || true)
if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
cublas=$(find /usr/local/cuda* /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=/tmp/dl:/usr/local/cuda/lib64:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee -a "$OUT/log.txt"
if has llama && [ ! -x /tmp/llama-build/bin/llama-bench ] && [ ! -f /tmp/llama-build.rc ]; then
  (LD_LIBRARY_PATH= setsid nice -n 19 bash bench/peer/llamacpp_cuda.sh build "$D" > /tmp/llama-build.out 2>&1
   echo $? > /tmp/llama-build.rc) &
fi
if has tests; then
  timeout 240 /tmp/dl/gpu_forward_test --gtest_filter='*Hybrid*:*Q4AllExpertsInVram*:GpuMoeRouting.*' 2>&1 |
    grep -vE '^\[ +(RUN|OK) ' > "$OUT/tests.log"
  grep -E "HYBRID|GPU-EXACT|FAILED|PASSED|Failure|Which is" "$OUT/tests.log" | cut -c1-220 | tail -40 | tee -a "$OUT/log.txt"
  echo "tests done at $(el) s" | tee -a "$OUT/log.txt"
fi
M=/tmp/q3-l$LAYERS
if [ ! -f $M.gguf ] && { has tierlm || has llama; }; then
  mkdir -p /tmp/tok && tar -C /tmp/tok -xJf "$D/qwen3.tar.xz"
  [ -f $M/config.json ] || /tmp/dl/synthetic_mlx_moe $M --tokenizer /tmp/tok/qwen3 --layers $LAYERS > "$OUT/synth.log" 2>&1
  echo "folder at $(el) s: $(du -sh $M | cut -f1)" | tee -a "$OUT/log.txt"
  if has llama; then
    /tmp/dl/gguf_export --from-mlx $M $M.gguf > "$OUT/gguf.log" 2>&1
    echo "gguf rc $? at $(el) s: $(du -sh $M.gguf | cut -f1)" | tee -a "$OUT/log.txt"
  fi
fi
# Prompts of about N tokens of plain English (PROMPT_TOKENS; LONG_PROMPT: one more tierlm run per plan, prefill only).
prompt_of() { python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the river bank.'] * max(1, $1 // 13)))"; }
P=$(prompt_of ${PROMPT_TOKENS:-128}); PL=$(prompt_of ${LONG_PROMPT:-512})
peak_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > /tmp/smi.txt 2>/dev/null & SMI=$!; }
peak_stop() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; sort -n /tmp/smi.txt | tail -1; }
if [ "${WAIT_BUILD:-0}" = 1 ] && has llama; then  # calibrate on an idle machine: after llama-bench's build
  while [ ! -f /tmp/llama-build.rc ]; do sleep 2; done
  echo "llama-bench built at $(el) s" | tee -a "$OUT/log.txt"
fi
for g in $GPU_GIB; do  # one plan per VRAM cap
  W=/tmp/hybrid-wisdom-$g.json
  if has tierlm && ! late calibrate && [ ! -f $W ]; then
    /tmp/dl/tierlm calibrate --model $M --wisdom $W --quick --gpu-memory $g --batch 1 --context 4096 \
      --trace-seconds ${TRACE_S:-20} > "$OUT/calibrate-$g.txt" 2> "$OUT/calibrate-$g.err"
    echo "calibrate --gpu-memory $g rc $? at $(el) s" | tee -a "$OUT/log.txt"
    grep -E "gpu|decode|rows" "$OUT/calibrate-$g.txt" | cut -c1-240 | tee -a "$OUT/log.txt"
  fi
done
tierlm_run() {  # round, GiB, cpu expert rows override ("plan" or a number), [long]
  late "tierlm $2 $3" && return
  local W=/tmp/hybrid-wisdom-$2.json err=$OUT/run-$1-$2-$3${4:-}.err prompt=$P
  [ "${4:-}" = long ] && prompt=$PL
  [ -f $W ] || return
  peak_start
  if [ "$3" = plan ]; then
    TIERLM_GPU_SETUP_REPORT=1 timeout 200 /tmp/dl/tierlm run --model $M --wisdom $W --on-missing-wisdom refuse \
      -n $DECODE --ignore-eos -p "$prompt" > /dev/null 2> $err
  else
    TIERLM_GPU_SETUP_REPORT=1 TIERLM_GPU_CPU_EXPERT_ROWS=$3 timeout 200 /tmp/dl/tierlm run --model $M --wisdom $W \
      --on-missing-wisdom refuse -n $DECODE --ignore-eos -p "$prompt" > /dev/null 2> $err
  fi
  local rc=$? peak; peak=$(peak_stop)
  python3 - "$1" "$3" "$rc" "$peak" "$err" "$2" <<'EOF' | tee -a "$OUT/hybrid.jsonl"
import json, re, sys
r, rows, rc, peak, err, gib = sys.argv[1:]
text = open(err, errors="replace").read()
m = re.search(r"prompt: (\d+) tokens, ([\d.]+) tok/s \| generated: (\d+) tokens, ([\d.]+) tok/s", text)
print(json.dumps({"round": int(r), "engine": "tierlm", "gpu_gib": float(gib), "cpu_expert_rows": rows, "rc": int(rc),
                  "peak_vram_mib": int(peak or 0), "prompt_tokens": int(m[1]) if m else None,
                  "prefill_tps": float(m[2]) if m else None, "decode_tokens": int(m[3]) if m else None,
                  "decode_tps": float(m[4]) if m else None,
                  "gpu_experts": (re.search(r"gpu experts: (.*)", text) or [None, None])[1],
                  "plan": (re.search(r"wisdom: plan (.*)", text) or [None, None])[1],
                  "tail": "" if m else text[-400:]}))
EOF
}
llama_run() {  # round, n_cpu_moe
  late "llama $2" && return
  peak_start
  timeout 200 /tmp/llama-build/bin/llama-bench -m $M.gguf -ngl 99 -fa 1 -ncmoe $2 -t $T -p ${PROMPT_TOKENS:-128},${LONG_PROMPT:-512} \
    -n $DECODE -r 2 -o jsonl 2>> "$OUT/llama.err" > /tmp/llama.jsonl
  local rc=$? peak; peak=$(peak_stop)
  python3 - "$1" "$2" "$rc" "$peak" <<'EOF' | tee -a "$OUT/hybrid.jsonl"
import json, sys
r, n, rc, peak = sys.argv[1:]
for l in open("/tmp/llama.jsonl"):
    d = json.loads(l)
    print(json.dumps({"round": int(r), "engine": "llama.cpp", "n_cpu_moe": int(n), "rc": int(rc),
                      "peak_vram_mib": int(peak or 0), "kind": "prefill" if d["n_prompt"] else "decode",
                      "tokens": d["n_prompt"] or d["n_gen"], "tps": d["avg_ts"], "stddev": d["stddev_ts"],
                      "type": d.get("model_type", "")}))
EOF
}
for r in $(seq ${ROUNDS:-2}); do
  if has tierlm; then
    for g in $GPU_GIB; do
      tierlm_run $r $g plan; [ "${COPY_AB:-1}" = 1 ] && tierlm_run $r $g 0; [ -n "${LONG_PROMPT:-}" ] && tierlm_run $r $g plan long
    done
  fi
  if has llama; then
    while [ ! -f /tmp/llama-build.rc ]; do sleep 2; done
    if [ "$(cat /tmp/llama-build.rc)" != 0 ]; then tail -20 /tmp/llama-build.out | tee -a "$OUT/log.txt"; STEPS=${STEPS/llama/}; continue; fi
    for n in ${NCMOE:-12 14 16 18}; do llama_run $r $n; done
  fi
done
echo "end at $(el) s" | tee -a "$OUT/log.txt"
