#!/usr/bin/env bash
# `tierlm run|serve --gpu-layers N` where no GPU can be used (a build without CUDA, or no visible device) must refuse
# at start: exit code 1 and the reason on stderr, never a crash, a hang, or a server that comes up without them.
# usage: gpu_layers_without_gpu.sh TIERLM_BINARY run|serve MODEL_DIR
# CUDA_VISIBLE_DEVICES=-1 hides every GPU (an invalid first index leaves none visible), so this holds on GPU machines.
set -u
binary="$1"; command="$2"; model="$3"
flags=(--model "$model" --no-wisdom --gpu-layers 2 --threads 1)
if [ "$command" = serve ]; then flags+=(--host 127.0.0.1 --port 0); else flags+=(--max-tokens 1); fi
out="$(CUDA_VISIBLE_DEVICES=-1 timeout 120 "$binary" "$command" "${flags[@]}" 2>&1 </dev/null)"
status=$?
printf '%s\n' "$out"
echo "exit code: $status"
[ "$status" -eq 1 ] || { echo "FAIL: expected exit code 1 (refused at start)"; exit 1; }
if ! printf '%s\n' "$out" | grep -Eq 'tierlm: error: gpu layers requested but (no CUDA device|this build has no CUDA backend)'; then
  echo "FAIL: no message saying why the GPU cannot be used"
  exit 1
fi
if printf '%s\n' "$out" | grep -q 'listening on'; then echo "FAIL: the server started"; exit 1; fi
exit 0
