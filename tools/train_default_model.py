#!/usr/bin/env python3
"""Trains the embedded default model, profiles/models/tierlm-tiny (run on the device machine: torch + CUDA).

A small Qwen3-MoE (6 layers, 8 experts per layer, top-2; ~5 M parameters, bf16) with its own byte-level BPE
tokenizer, trained for TRAIN_SECONDS (default 150) on Python's standard-library docstrings plus synthetic ChatML
dialogs in which the assistant calls tools and answers from their results (tools/tool_dialogs.py). Its chat template
(TINY_CHAT_TEMPLATE) lists the offered tools in the system turn and writes calls as Qwen/Hermes-style
<tool_call>{"name": ..., "arguments": ...}</tool_call> blocks, so `tierlm serve` parses them into OpenAI tool_calls.

Writes OUT_DIR/models/tierlm-tiny/: weights, tokenizer, template, and reference.json with
- prompts: plain-text prompts with transformers' greedy tokens (tests/runtime/engine/default_model_test.cpp);
- dialogs: held-out tool dialogs with the prompt ids transformers' apply_chat_template gives and the greedy tokens;
- tool_eval: on held-out dialogs (tools/tool_dialogs.py held_out_dialogs, entities partly unseen in training), how
  often the model calls the right tool with the right arguments, declines when no offered tool fits, and answers
  from a tool's result.

usage: python3 tools/train_default_model.py OUT_DIR
"""
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tool_dialogs  # noqa: E402
from train_step import train_step  # noqa: E402

TINY_CHAT_TEMPLATE = r"""{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\n\n' -}}{%- endif -%}
{{- '# Tools\n<tools>\n' -}}
{%- for tool in tools -%}
{{- (tool['function'] if tool['function'] is defined else tool) | tojson -}}{{- '\n' -}}
{%- endfor -%}
{{- '</tools>\nTo call a tool, reply with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\n' -}}
{%- elif messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if not (loop.first and message['role'] == 'system') -%}
{{- '<|im_start|>' + message['role'] + '\n' -}}
{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}
{%- if message['tool_calls'] is defined and message['tool_calls'] -%}
{%- for call in message['tool_calls'] -%}
{%- set fn = call['function'] if call['function'] is defined else call -%}
{{- '<tool_call>\n{"name": "' + fn['name'] + '", "arguments": ' -}}
{{- fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -}}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def docstring_corpus():
    import importlib
    import pkgutil
    texts = []
    skip = ("test", "idlelib", "tkinter", "turtle", "antigravity", "this", "lib2to3", "ensurepip", "pydoc_data")
    for m in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if m.name.startswith("_") or m.name.startswith(skip) or not str(getattr(m.module_finder, "path", "")).startswith(sys.base_prefix):
            continue
        try:
            mod = importlib.import_module(m.name)
        except Exception:
            continue
        for obj in [mod] + [getattr(mod, a, None) for a in sorted(dir(mod)) if not a.startswith("_")]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                texts.append(doc.strip())
    seen, out = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def jinja_render(messages, tools, add_generation_prompt):
    """The template rendered as transformers' apply_chat_template sets jinja2 up (checked against it below)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, ensure_ascii=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return env.from_string(TINY_CHAT_TEMPLATE).render(messages=messages, tools=tools or None,
                                                      add_generation_prompt=add_generation_prompt)


def parse_call(text):
    """The first <tool_call> block of a completion as (name, arguments) or None."""
    start = text.find("<tool_call>")
    if start < 0:
        return None
    end = text.find("</tool_call>", start)
    if end < 0:
        return ("<malformed>", None)
    try:
        call = json.loads(text[start + len("<tool_call>"):end])
        return (call.get("name"), call.get("arguments"))
    except Exception:
        return ("<malformed>", None)


def main():
    out_root = sys.argv[1]
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig

    docs = docstring_corpus()
    train_dialogs = tool_dialogs.dialogs(24000, seed=1)
    dialog_texts = [jinja_render(d["messages"], d["tools"], False) for d in train_dialogs]
    print(f"corpus: {len(docs)} docstrings ({sum(map(len, docs))} chars), {len(dialog_texts)} tool dialogs "
          f"({sum(map(len, dialog_texts))} chars)", flush=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs + dialog_texts[:4000], trainer)
    d = os.path.join(out_root, "models", "tierlm-tiny")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
                   "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 1024}, f)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(TINY_CHAT_TEMPLATE)
    hf_tok = PreTrainedTokenizerFast.from_pretrained(d)
    for dl in train_dialogs[:50] + tool_dialogs.held_out_dialogs(50):  # our renderer == transformers'
        assert hf_tok.apply_chat_template(dl["messages"], tools=dl["tools"] or None, tokenize=False) == \
            jinja_render(dl["messages"], dl["tools"], False), dl

    doc_ids = []
    for t in docs:
        doc_ids.extend(tok.encode(t).ids + [eos])
    dia_ids, dia_starts = [], []
    for t in dialog_texts:
        dia_starts.append(len(dia_ids))
        dia_ids.extend(tok.encode(t).ids + [eos])
    doc_data, dia_data = torch.tensor(doc_ids), torch.tensor(dia_ids)
    print(f"tokens: {len(doc_ids)} docstring, {len(dia_ids)} dialog", flush=True)

    cfg = Qwen3MoeConfig(vocab_size=tok.get_vocab_size(), hidden_size=256, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8,
                         num_experts_per_tok=2, moe_intermediate_size=96, intermediate_size=768,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         output_router_logits=True, router_aux_loss_coef=0.01, max_position_embeddings=1024,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos,
                         pad_token_id=eos, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).cuda()
    print(f"parameters: {sum(p.numel() for p in model.parameters())}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05, betas=(0.9, 0.95))
    seq, half, budget_s = 512, 32, float(os.environ.get("TRAIN_SECONDS", "150"))
    g = torch.Generator().manual_seed(7)
    starts_t = torch.tensor([s for s in dia_starts if s + seq + 1 < len(dia_ids)])
    t0, step = time.time(), 0
    while time.time() - t0 < budget_s:
        ds = torch.randint(0, len(doc_data) - seq - 1, (half,), generator=g)
        dd = starts_t[torch.randint(0, len(starts_t), (half,), generator=g)]
        x = torch.stack([doc_data[s:s + seq] for s in ds] + [dia_data[s:s + seq] for s in dd]).cuda()
        frac = (time.time() - t0) / budget_s
        lr = 2e-3 * min(1.0, (step + 1) / 100) * (1.0 - 0.9 * frac)
        loss = train_step(model, opt, x, lr)
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
        step += 1
    print(f"trained {step} steps, final loss {loss.item():.3f}", flush=True)
    model.config.output_router_logits = False
    model.cpu().to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    # References come from the saved files: .to(bfloat16) also rounds the rotary inv_freq buffer, which a model loaded
    # from disk recomputes in float32 (train_quality_model.py's first reference was 0.10 nats off a token for that).
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

    @torch.no_grad()
    def greedy(ids, steps, stop=None):
        cur = torch.tensor([ids])
        out = []
        for _ in range(steps):
            nxt = int(model(cur, use_cache=False).logits[0, -1].argmax())
            out.append(nxt)
            if stop is not None and nxt == stop:
                break
            cur = torch.cat([cur, torch.tensor([[nxt]])], dim=1)
        return out

    refs = []
    for p in ["Return the number of", "Create a new", "The default value is"]:
        ids = tok.encode(p).ids
        g_ids = greedy(ids, 32)
        refs.append({"text": p, "prompt": ids, "greedy": g_ids, "completion": tok.decode(g_ids)})
        print(repr(p), "->", repr(refs[-1]["completion"]), flush=True)

    # Held-out evaluation (greedy, stops at <|im_end|>), on the GPU in batches of one for simplicity.
    model = model.cuda()

    @torch.no_grad()
    def complete(text, steps=80):
        ids = torch.tensor([tok.encode(text).ids]).cuda()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                             eos_token_id=im_end, pad_token_id=eos)[0, ids.shape[1]:].tolist()
        if out and out[-1] == im_end:
            out = out[:-1]
        return tok.decode(out, skip_special_tokens=False)

    held = tool_dialogs.held_out_dialogs(int(os.environ.get("EVAL_DIALOGS", "200")))
    stats = {"dialogs": len(held), "tool_expected": 0, "right_tool": 0, "right_arguments": 0, "no_tool_expected": 0,
             "correctly_declined": 0, "answers_from_result": 0}
    for dl in held:
        msgs = dl["messages"]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        text = complete(jinja_render(msgs[:first], dl["tools"], True))
        call = parse_call(text)
        if dl["expect_tool"]:
            stats["tool_expected"] += 1
            if call and call[0] == dl["expect_tool"]:
                stats["right_tool"] += 1
                if call[1] == dl["expect_arguments"]:
                    stats["right_arguments"] += 1
            final = complete(jinja_render(msgs[:-1], dl["tools"], True))
            if final == msgs[-1]["content"]:
                stats["answers_from_result"] += 1
        else:
            stats["no_tool_expected"] += 1
            if call is None:
                stats["correctly_declined"] += 1
    print("tool_eval", json.dumps(stats), flush=True)
    model = model.cpu()

    dialog_refs = []
    for dl in [x for x in held if x["expect_tool"]][:5] + [x for x in held if not x["expect_tool"]][:2]:
        msgs = dl["messages"]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        prompt_ids = hf_tok.apply_chat_template(msgs[:first], tools=dl["tools"] or None, add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        if isinstance(prompt_ids, dict):
            prompt_ids = prompt_ids["input_ids"]
        g_ids = greedy(list(prompt_ids), 40)
        dialog_refs.append({"messages": msgs[:first], "tools": dl["tools"], "prompt": list(prompt_ids),
                            "greedy": g_ids, "completion": tok.decode(g_ids, skip_special_tokens=False),
                            "expect_tool": dl["expect_tool"], "expect_arguments": dl["expect_arguments"]})
        print("dialog ->", repr(dialog_refs[-1]["completion"]), flush=True)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"model_type": "qwen3_moe", "prompts": refs, "dialogs": dialog_refs, "tool_eval": stats,
                   "train": {"seconds": budget_s, "steps": step, "final_loss": round(loss.item(), 4)},
                   "transformers": transformers.__version__}, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
