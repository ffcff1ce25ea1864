#!/usr/bin/env python3
"""Trains tests/fixtures/models/code-small, the model KV codec quality is measured on (run on the device machine).

The embedded tierlm-tiny memorized its training docstrings (final loss 0.08) and is worse than uniform on text it has
not seen, so a perplexity measured with it says little. This one is a small dense llama (4 layers, hidden 256,
2 query heads of head_dim 128 sharing one KV head, 2,048 positions: the head_dim real models use, where a KV codec
works per head) trained for at most EPOCHS passes (default 4; more memorize it) over the Python standard library's source files of the device's
Python, with tierlm-tiny's byte-level BPE tokenizer (2,048 tokens). A few packages are held out of training and
scored after it, so the model is known to generalize before anything is measured with it.

Writes OUT_DIR/code-small/: weights (bf16), config, tokenizer, and reference.json with
- text: profiles/text/kv-quality.txt (written for tierlm, seen by no model) as token ids, with the per-token
  negative log-likelihood transformers computes from the saved weights in float32 (the oracle of
  tests/runtime/engine/perplexity_test.cpp) and its perplexity;
- heldout: the perplexity on the held-out standard-library packages; train: steps, seconds, final loss.

usage: python3 tools/train_quality_model.py OUT_DIR   (from the repository root)
"""
import json
import math
import os
import shutil
import sys
import sysconfig
import time

import torch
import transformers
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import train_step  # noqa: E402

HELD_OUT = ("email", "xml", "json", "http", "concurrent")


def corpus():
    root = sysconfig.get_paths()["stdlib"]
    train, held = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.startswith(("test", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter", "turtledemo")) \
                or "__pycache__" in rel or "/test" in rel:
            dirnames[:] = []
            continue
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            try:
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            (held if rel.split(os.sep)[0] in HELD_OUT else train).append(text)
    return train, held


def main():
    out = os.path.join(sys.argv[1], "code-small")
    os.makedirs(out, exist_ok=True)
    tiny = "profiles/models/tierlm-tiny"
    tok = Tokenizer.from_file(os.path.join(tiny, "tokenizer.json"))
    shutil.copy(os.path.join(tiny, "tokenizer.json"), out)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
                   "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 2048}, f)
    eos = tok.token_to_id("<|endoftext|>")
    train, held = corpus()
    ids = []
    for t in train:
        ids.extend(tok.encode(t).ids + [eos])
    held_ids = []
    for t in held:
        held_ids.extend(tok.encode(t).ids + [eos])
    data, held_data = torch.tensor(ids), torch.tensor(held_ids)
    print(f"train {len(train)} files {len(ids)} tokens, held out {len(held)} files {len(held_ids)} tokens", flush=True)

    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=640,
                                   num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                                   max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                   bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).cuda()
    print(f"parameters: {sum(p.numel() for p in model.parameters())}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    # One pass over the corpus at most: more epochs memorize it (a 150 s run of 30 epochs reached loss 0.23 with a
    # held-out perplexity of 175).
    seq, batch, budget_s = 1024, 16, float(os.environ.get("TRAIN_SECONDS", "150"))
    epochs = float(os.environ.get("EPOCHS", "4"))
    max_steps = max(1, int(epochs * len(data) / (seq * batch)))
    g = torch.Generator().manual_seed(7)
    t0, step = time.time(), 0
    while time.time() - t0 < budget_s and step < max_steps:
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq] for s in starts]).cuda()
        frac = max((time.time() - t0) / budget_s, step / max_steps)
        lr = 3e-3 * min(1.0, (step + 1) / 100) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        loss = train_step(model, opt, x, lr)
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
        step += 1
    train_seconds = time.time() - t0
    print(f"trained {step} steps ({epochs} epochs), final loss {loss.item():.3f}", flush=True)
    model.cpu().to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # The reference is scored on the saved files: .to(bfloat16) also rounds the rotary inv_freq buffer, which a model
    # loaded from disk recomputes in float32 (scoring the in-memory copy differed by up to 0.10 nats a token).
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()

    @torch.no_grad()
    def nll(token_ids):
        x = torch.tensor([token_ids])
        logits = model(x, use_cache=False).logits[0, :-1].double()
        lp = torch.log_softmax(logits, dim=-1)
        return (-lp.gather(1, x[0, 1:, None].long())[:, 0]).tolist()

    text = open("profiles/text/kv-quality.txt", encoding="utf-8").read()
    text_ids = tok.encode(text).ids[:1024]  # the trained length
    text_nll = nll(text_ids)
    heldout = []
    for s in range(0, min(len(held_ids) - 1024, 64 * 1024), 1024):
        heldout.extend(nll(held_ids[s:s + 1024]))
    ref = {"text": {"file": "profiles/text/kv-quality.txt", "ids": text_ids, "nll": text_nll,
                    "perplexity": math.exp(sum(text_nll) / len(text_nll))},
           "heldout": {"packages": list(HELD_OUT), "tokens": len(heldout),
                       "perplexity": math.exp(sum(heldout) / len(heldout))},
           "train": {"seconds": round(train_seconds), "epochs": epochs, "steps": step, "final_loss": loss.item(), "tokens": len(ids)},
           "transformers": transformers.__version__}
    print("kv-quality.txt perplexity", ref["text"]["perplexity"], "held-out", ref["heldout"]["perplexity"], flush=True)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()
