#!/usr/bin/env python3
"""Writes the golden files the tokenizer tests compare against, using Hugging Face `tokenizers` as the oracle.

Usage: make_tokenizer_golden.py CORPUS_JSONL TOKENIZERS_DIR OUT_DIR
TOKENIZERS_DIR holds <name>/tokenizer.json (as tools/fetch_tokenizers.sh lays them out). For each <name> it writes
OUT_DIR/golden_<name>.jsonl.gz (gzip, mtime 0) with one JSON object per line:
  {"kind": "meta", ...}                                  versions and sizes
  {"kind": "text", "id": N, "enc": [...], "enc_special": [...], "dec": str, "dec_skip": str}
      enc = encode(text, add_special_tokens=False), enc_special = encode(text, add_special_tokens=True);
      dec / dec_skip = decode(enc_special, skip_special_tokens=False / True)
  {"kind": "ids", "ids": [...], "tokens": [...], "dec": str, "dec_skip": str, "stream": [...] (when available)}
      decode of seeded random id sequences (byte tokens, added tokens, anything), to pin invalid UTF-8 handling.
It also records HF's DecodeStream chunks for some texts ("stream" on text lines) when the installed version has it.
"""
import gzip
import io
import json
import os
import random
import sys
import time

import tokenizers
from tokenizers import Tokenizer

NAMES = ["qwen3", "llama3", "gemma3", "deepseek_v3"]
STREAM_TEXTS = 400
RANDOM_SEQUENCES = 600


def stream_chunks(tok, ids, skip):
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    try:
        ds = DecodeStream(skip_special_tokens=skip)
        return [ds.step(tok, i) for i in ids]
    except Exception as e:  # noqa: BLE001 - the stream record is optional
        return ["error: " + repr(e)]


def main():
    corpus_path, tok_root, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out_dir, exist_ok=True)
    texts = []
    with open(corpus_path, encoding="utf-8", newline="\n") as f:
        for line in f:
            obj = json.loads(line)
            texts.append((obj["id"], obj["text"]))
    print(f"tokenizers {tokenizers.__version__}; {len(texts)} texts", flush=True)
    for name in NAMES:
        t0 = time.time()
        tok = Tokenizer.from_file(os.path.join(tok_root, name, "tokenizer.json"))
        size = tok.get_vocab_size(with_added_tokens=True)
        vocab = tok.get_vocab(with_added_tokens=True)
        max_id = max(vocab.values())
        try:
            added = sorted(tok.get_added_tokens_decoder().keys())
        except Exception:  # noqa: BLE001
            added = []
        single_char = sorted(i for s, i in vocab.items() if len(s) == 1)
        byte_tokens = sorted(i for s, i in vocab.items() if len(s) == 6 and s.startswith("<0x") and s.endswith(">"))
        path = os.path.join(out_dir, f"golden_{name}.jsonl.gz")
        mismatched_streams = 0
        with io.TextIOWrapper(gzip.GzipFile(path, "wb", mtime=0), encoding="utf-8", newline="\n") as out:
            meta = {"kind": "meta", "name": name, "tokenizers_version": tokenizers.__version__,
                    "vocab_size_with_added": size, "vocab_size_model": tok.get_vocab_size(with_added_tokens=False),
                    "max_id": max_id}
            out.write(json.dumps(meta, ensure_ascii=False) + "\n")
            for n, (tid, text) in enumerate(texts):
                enc = tok.encode(text, add_special_tokens=False).ids
                enc_sp = tok.encode(text, add_special_tokens=True).ids
                rec = {"kind": "text", "id": tid, "enc": enc, "enc_special": enc_sp,
                       "dec": tok.decode(enc_sp, skip_special_tokens=False),
                       "dec_skip": tok.decode(enc_sp, skip_special_tokens=True)}
                if n < STREAM_TEXTS:
                    s = stream_chunks(tok, enc_sp, False)
                    if s is not None:
                        rec["stream"] = s
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            rng = random.Random(1234 + NAMES.index(name))
            for k in range(RANDOM_SEQUENCES):
                length = rng.randint(1, 16)
                ids = []
                for _ in range(length):
                    r = rng.random()
                    if r < 0.35:
                        ids.append(rng.randint(0, max_id))
                    elif r < 0.55 and added:
                        ids.append(rng.choice(added))
                    elif r < 0.8 and byte_tokens:
                        ids.append(rng.choice(byte_tokens))
                    else:
                        ids.append(rng.choice(single_char))
                rec = {"kind": "ids", "ids": ids, "tokens": [tok.id_to_token(i) for i in ids],
                       "dec": tok.decode(ids, skip_special_tokens=False),
                       "dec_skip": tok.decode(ids, skip_special_tokens=True)}
                s = stream_chunks(tok, ids, False)
                if s is not None:
                    rec["stream"] = s
                    if "".join(c for c in s if c is not None) != rec["dec"]:
                        mismatched_streams += 1
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
        print(f"{name}: vocab {size} (max id {max_id}), {len(added)} added, {len(byte_tokens)} byte tokens, "
              f"stream!=decode on {mismatched_streams} random sequences, {time.time() - t0:.1f}s -> {path}",
              flush=True)
    # Also record what transformers' AutoTokenizer adds (it can differ from tokenizer.json's post-processor, e.g. a
    # BOS driven by tokenizer_config.json's add_bos_token); informational only.
    try:
        from transformers import AutoTokenizer
        path = os.path.join(out_dir, "transformers_special.jsonl")
        with open(path, "w", encoding="utf-8", newline="\n") as out:
            for name in NAMES:
                try:
                    at = AutoTokenizer.from_pretrained(os.path.join(tok_root, name))
                    for tid, text in texts[:300]:
                        out.write(json.dumps({"name": name, "id": tid, "enc_special": at(text)["input_ids"],
                                              "class": type(at).__name__}) + "\n")
                    print(f"transformers {name}: {type(at).__name__}", flush=True)
                except Exception as e:  # noqa: BLE001 - informational only
                    print(f"transformers {name}: failed: {e!r}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"transformers unavailable: {e!r}", flush=True)


if __name__ == "__main__":
    main()
