#!/usr/bin/env bash
# bench/peer.sh — tierlm against llama.cpp (npm node-llama-cpp 3.22.1, prebuilt CPU library) on the same weights:
# a synthetic Llama-shaped HF folder (f16) for tierlm and GGUF F16 / Q8_0 / Q4_0 / Q4_K written from it by gguf_export
# for llama.cpp (format q4k: tierlm's q4 against llama.cpp's Q4_K; q4: against Q4_0). First checks that both engines
# greedy-decode the same tokens from the f16 weights (same model), then runs both interleaved, same threads, ROUNDS
# times, and prints median prefill and decode tok/s and the ratios per format and thread count (Markdown on stdout,
# JSON in $WORK/peer-results.json).
#
# Usage: bench/peer.sh [BUILD_DIR]      (targets synthetic_hf gguf_export tierlm_peer must be built)
# Environment: SHAPE=1b|8b LAYERS=N (0: the shape's own) THREADS="2" FORMATS="f16 q8_0 q4 q4k" ROUNDS=3
#              PROMPT=128 DECODE=32 WORK=/tmp/tierlm-peer (model files, a few GB per shape)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
shape="${SHAPE:-1b}"; layers="${LAYERS:-0}"; threads_list="${THREADS:-2}"; formats="${FORMATS:-f16 q8_0 q4 q4k}"
rounds="${ROUNDS:-3}"; prompt="${PROMPT:-128}"; decode="${DECODE:-32}"; work="${WORK:-/tmp/tierlm-peer}"
name="$shape-l$layers"; hf="$work/$name-hf"
mkdir -p "$work"

if [ ! -d "$here/peer/node_modules/node-llama-cpp" ]; then
  echo "peer.sh: installing node-llama-cpp into bench/peer/node_modules" >&2
  (cd "$here/peer" && npm install --no-audit --no-fund >&2)
fi
gguf_type() { case "$1" in f16) echo f16;; q8_0) echo q8_0;; q4) echo q4_0;; q4k) echo q4_k;; *) echo "peer.sh: no GGUF peer for $1" >&2; exit 2;; esac; }
tierlm_format() { case "$1" in q4k) echo q4;; *) echo "$1";; esac; }  # the row's label is kept on both engines' lines
[ -f "$hf/model.safetensors" ] || "$build/bench/synthetic_hf" "$hf" --shape "$shape" --layers "$layers"
for f in $(printf '%s\n' f16 $formats | sort -u); do  # f16 always: the same-model check below runs on it
  g="$work/$name-$(gguf_type "$f").gguf"
  [ -f "$g" ] || "$build/bench/gguf_export" "$hf" "$g" "$(gguf_type "$f")"
done

tierlm() { "$build/bench/tierlm_peer" "$hf" "$(tierlm_format "$1")" "$2" "$3" "$4" 2>/dev/null |
           sed "s/\"format\":\"[^\"]*\"/\"format\":\"$1\"/"; }
llamacpp() { node "$here/peer/llamacpp_peer.mjs" "$work/$name-$(gguf_type "$1").gguf" "$1" "$2" "$3" "$4"; }

results="$work/peer-results.jsonl"; : > "$results"
# Same model: greedy tokens from the f16 weights, short prompt.
first_threads="${threads_list%% *}"
{ tierlm f16 "$first_threads" 32 8; llamacpp f16 "$first_threads" 32 8; } | sed 's/^{/{"check":true,/' >> "$results"
for r in $(seq "$rounds"); do
  for t in $threads_list; do
    for f in $formats; do
      echo "peer.sh: round $r threads $t $f" >&2
      tierlm "$f" "$t" "$prompt" "$decode" >> "$results"
      llamacpp "$f" "$t" "$prompt" "$decode" >> "$results"
    done
  done
done
python3 "$here/peer/summarize.py" "$results" "$work/peer-results.json" "$shape" "$layers"
