#!/usr/bin/env bash
# `tierlm run` on a Qwen3.5 folder (a transformers fixture: ConditionalGeneration checkpoint with vision tower and mtp
# tensors, Gated DeltaNet + gated attention layers, MoE experts through the expert tier) prints transformers' greedy
# completion. The fixture has no tokenizer, so the test gives it one whose token i is the character U+4E00+i (BPE,
# no merges): the reference prompt's ids spell a string, and the expected completion is reference.json's greedy ids.
# usage: qwen35_run.sh TIERLM_BINARY FIXTURE_DIR
set -euo pipefail
bin="$1" fixture="$2"
work="$(mktemp -d)"
XDG_CACHE_HOME="$work/cache"
export XDG_CACHE_HOME
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

model="$work/model"
mkdir -p "$model"
for f in config.json model.safetensors; do ln -s "$(realpath "$fixture/$f")" "$model/$f"; done
python3 - "$fixture/reference.json" "$model" "$work" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))
model, work = sys.argv[2], sys.argv[3]
char = lambda i: chr(0x4E00 + i)
vocab = {char(i): i for i in range(256)}
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
       "pre_tokenizer": None, "post_processor": None, "decoder": None,
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
json.dump(tok, open(f"{model}/tokenizer.json", "w"), ensure_ascii=False)
json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(f"{model}/tokenizer_config.json", "w"))
prompt = "".join(char(i) for i in ref["prompt"])
open(f"{work}/prompt", "w").write(prompt)
open(f"{work}/expected", "w").write(prompt + "".join(char(i) for i in ref["greedy"][:12]) + "\n")
PY
"$bin" run --model "$model" --prompt "$(cat "$work/prompt")" -n 12 --threads 1 --no-wisdom >"$work/out" 2>"$work/err" ||
  { cat "$work/err"; fail "tierlm run failed"; }
cmp -s "$work/out" "$work/expected" || { cat "$work/err"; echo "got:      $(cat "$work/out")";
  echo "expected: $(cat "$work/expected")"; fail "the completion differs from transformers' greedy tokens"; }
grep -q "skipping .* vision-tower tensors and .* (mtp\.\*) tensors" "$work/err" ||
  { cat "$work/err"; fail "the skipped vision/mtp tensors were not reported"; }
echo "OK: tierlm run on $(basename "$fixture") printed transformers' 12 greedy tokens"
