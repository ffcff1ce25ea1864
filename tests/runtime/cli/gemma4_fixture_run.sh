#!/usr/bin/env bash
# `tierlm run` on a transformers fixture with a 256-token vocabulary (Gemma 4, gpt-oss; tests/fixtures/models/NAME
# has no tokenizer): a byte-level tokenizer without merges is written beside links to its config and weights, its
# 256 byte symbols permuted so the fixture's prompt ids and greedy ids are ASCII letters and digits. The prompt text
# then encodes to exactly the fixture's prompt, and stdout must be that prompt followed by the decoded 32 greedy
# tokens transformers produced.
# usage: gemma4_fixture_run.sh TIERLM_BINARY FIXTURE_DIR
set -euo pipefail
bin="$1" fixture="$(cd "$2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ln -s "$fixture/config.json" "$work/config.json"
ln -s "$fixture/model.safetensors" "$work/model.safetensors"
python3 - "$fixture/reference.json" "$work" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))
out = sys.argv[2]
# GPT-2's byte <-> symbol table (what the ByteLevel pre-tokenizer and decoder use).
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
symbol = {b: chr(c) for b, c in zip(bs, cs)}
wanted = list(dict.fromkeys(ref["prompt"] + ref["greedy"]))  # ids that must be printable, first seen first
ascii_bytes = [ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
assert len(wanted) <= len(ascii_bytes), "too many distinct ids for the printable alphabet"
byte_of = dict(zip(wanted, ascii_bytes))
rest = iter(b for b in range(256) if b not in byte_of.values())
for i in range(256):
    if i not in byte_of:
        byte_of[i] = next(rest)
vocab = {symbol[byte_of[i]]: i for i in range(256)}
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
             "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
             "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                       "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                       "ignore_merges": False, "vocab": vocab, "merges": []}}
json.dump(tokenizer, open(out + "/tokenizer.json", "w"))
text = lambda ids: "".join(chr(byte_of[i]) for i in ids)
open(out + "/prompt.txt", "w").write(text(ref["prompt"]))
open(out + "/expected.txt", "w").write(text(ref["prompt"]) + text(ref["greedy"]))
PY
prompt="$(cat "$work/prompt.txt")"
"$bin" run --model "$work" --prompt "$prompt" --max-tokens 32 --ignore-eos --threads 1 --no-wisdom \
  >"$work/out" 2>"$work/err" || { cat "$work/err"; echo "FAIL: tierlm run exited with an error"; exit 1; }
if [ "$(cat "$work/out")" != "$(cat "$work/expected.txt")" ]; then
  echo "FAIL: stdout differs from transformers' greedy completion"
  echo "got:      $(cat "$work/out")"
  echo "expected: $(cat "$work/expected.txt")"
  cat "$work/err"
  exit 1
fi
echo "PASS: $(basename "$fixture"): $(cat "$work/out")"
