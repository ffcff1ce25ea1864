#!/usr/bin/env python3
"""Writes a model folder `tierlm fit` can read for one of the published shapes beside this script: its config.json
and safetensors shards whose headers list every tensor the published checkpoint stores (names, dtypes, shapes,
offsets) while the data is a hole (the files are sparse: a 690 GB DeepSeek-V3 takes a few MB of disk). fit reads
only config.json and the headers, so it sees the real model; nothing may load these weights.

usage: write_shards.py CONFIG_DIR OUT_DIR   (prints the stored bytes)
"""
import json
import os
import struct
import sys


def bf16(name, shape):
    return [(name, "BF16", shape)]


def mlx4(prefix, shape, group=64, bits=4):
    # MLX affine: uint32 words of 32/bits values along the input dimension, a scale and a bias per group.
    *outer, cols = shape
    return [(prefix + ".weight", "U32", outer + [cols * bits // 32]),
            (prefix + ".scales", "BF16", outer + [cols // group]),
            (prefix + ".biases", "BF16", outer + [cols // group])]


def fp8(prefix, shape):
    # DeepSeek-V3: e4m3 weights with an f32 inverse scale per 128 x 128 block.
    rows, cols = shape
    return [(prefix + ".weight", "F8_E4M3", shape),
            (prefix + ".weight_scale_inv", "F32", [(rows + 127) // 128, (cols + 127) // 128])]


def qwen3_moe(c):
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    E, I = c["num_experts"], c["moe_intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    t = bf16("model.embed_tokens.weight", [V, H]) + bf16("lm_head.weight", [V, H]) + bf16("model.norm.weight", [H])
    for l in range(L):
        p = "model.layers.%d." % l
        t += bf16(p + "input_layernorm.weight", [H]) + bf16(p + "post_attention_layernorm.weight", [H])
        for n, s in (("q_proj", [q, H]), ("k_proj", [kv, H]), ("v_proj", [kv, H]), ("o_proj", [H, q])):
            t += bf16(p + "self_attn.%s.weight" % n, s)
        t += bf16(p + "self_attn.q_norm.weight", [c["head_dim"]]) + bf16(p + "self_attn.k_norm.weight", [c["head_dim"]])
        t += bf16(p + "mlp.gate.weight", [E, H])
        for e in range(E):
            for n, s in (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])):
                t += bf16(p + "mlp.experts.%d.%s.weight" % (e, n), s)
    return t


def gpt_oss(c):
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    E, I, nh = c["num_local_experts"], c["intermediate_size"], c["num_attention_heads"]
    q, kv = nh * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    t = bf16("model.embed_tokens.weight", [V, H]) + bf16("lm_head.weight", [V, H]) + bf16("model.norm.weight", [H])
    for l in range(L):
        p = "model.layers.%d." % l
        t += bf16(p + "input_layernorm.weight", [H]) + bf16(p + "post_attention_layernorm.weight", [H])
        for n, s in (("q_proj", [q, H]), ("k_proj", [kv, H]), ("v_proj", [kv, H]), ("o_proj", [H, q])):
            t += bf16(p + "self_attn.%s.weight" % n, s) + bf16(p + "self_attn.%s.bias" % n, s[:1])
        t += bf16(p + "self_attn.sinks", [nh])
        t += bf16(p + "mlp.router.weight", [E, H]) + bf16(p + "mlp.router.bias", [E])
        # MXFP4 experts: 16 bytes of 32 e2m1 values and one e8m0 scale per 32 inputs, biases in bf16.
        for n, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            t += [(p + "mlp.experts.%s_blocks" % n, "U8", [E, rows, cols // 32, 16]),
                  (p + "mlp.experts.%s_scales" % n, "U8", [E, rows, cols // 32])]
            t += bf16(p + "mlp.experts.%s_bias" % n, [E, rows])
    return t


def deepseek(c):
    """deepseek_v3 (FP8 with block scales, q LoRA, score correction bias) and deepseek_v2 (bf16, q_proj when
    q_lora_rank is null, a plain softmax gate)."""
    H, V, E = c["hidden_size"], c["vocab_size"], c["n_routed_experts"]
    L = c["num_hidden_layers"] + c.get("num_nextn_predict_layers", 0)
    nh, I, Im = c["num_attention_heads"], c["intermediate_size"], c["moe_intermediate_size"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    lin = fp8 if "quantization_config" in c else (lambda prefix, shape: bf16(prefix + ".weight", shape))
    t = bf16("model.embed_tokens.weight", [V, H]) + bf16("lm_head.weight", [V, H]) + bf16("model.norm.weight", [H])
    for l in range(L):
        p = "model.layers.%d." % l
        t += bf16(p + "input_layernorm.weight", [H]) + bf16(p + "post_attention_layernorm.weight", [H])
        if c.get("q_lora_rank"):
            t += lin(p + "self_attn.q_a_proj", [c["q_lora_rank"], H])
            t += bf16(p + "self_attn.q_a_layernorm.weight", [c["q_lora_rank"]])
            t += lin(p + "self_attn.q_b_proj", [nh * qk, c["q_lora_rank"]])
        else:
            t += lin(p + "self_attn.q_proj", [nh * qk, H])
        t += lin(p + "self_attn.kv_a_proj_with_mqa", [c["kv_lora_rank"] + c["qk_rope_head_dim"], H])
        t += bf16(p + "self_attn.kv_a_layernorm.weight", [c["kv_lora_rank"]])
        t += lin(p + "self_attn.kv_b_proj", [nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]])
        t += lin(p + "self_attn.o_proj", [H, nh * c["v_head_dim"]])
        if l < c["first_k_dense_replace"]:
            for n, s in (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])):
                t += lin(p + "mlp." + n, s)
            continue
        t += [(p + "mlp.gate.weight", "BF16", [E, H])]
        if c["model_type"] == "deepseek_v3":
            t += [(p + "mlp.gate.e_score_correction_bias", "F32", [E])]
        S = Im * c["n_shared_experts"]
        for n, s in (("gate_proj", [S, H]), ("up_proj", [S, H]), ("down_proj", [H, S])):
            t += lin(p + "mlp.shared_experts." + n, s)
        for e in range(E):
            for n, s in (("gate_proj", [Im, H]), ("up_proj", [Im, H]), ("down_proj", [H, Im])):
                t += lin(p + "mlp.experts.%d.%s" % (e, n), s)
    return t


def gemma4(c):
    c = c["text_config"]
    H, V, L, E, I, Im = (c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_experts"],
                         c["intermediate_size"], c["moe_intermediate_size"])
    p0 = "model.language_model."
    t = bf16(p0 + "embed_tokens.weight", [V, H]) + bf16(p0 + "norm.weight", [H])
    for l, kind in enumerate(c["layer_types"]):
        p = p0 + "layers.%d." % l
        full = kind == "full_attention"
        hd = c["global_head_dim"] if full else c["head_dim"]
        nkv = c["num_global_key_value_heads"] if full and c["attention_k_eq_v"] else c["num_key_value_heads"]
        t += bf16(p + "self_attn.q_proj.weight", [c["num_attention_heads"] * hd, H])
        t += bf16(p + "self_attn.k_proj.weight", [nkv * hd, H])
        if not (full and c["attention_k_eq_v"]):
            t += bf16(p + "self_attn.v_proj.weight", [nkv * hd, H])
        t += bf16(p + "self_attn.o_proj.weight", [H, c["num_attention_heads"] * hd])
        t += bf16(p + "self_attn.q_norm.weight", [hd]) + bf16(p + "self_attn.k_norm.weight", [hd])
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                  "pre_feedforward_layernorm_2"):
            t += bf16(p + n + ".weight", [H])
        for n, s in (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])):
            t += bf16(p + "mlp.%s.weight" % n, s)
        t += bf16(p + "router.proj.weight", [E, H]) + bf16(p + "router.scale", [H])
        t += bf16(p + "router.per_expert_scale", [E])
        t += bf16(p + "experts.gate_up_proj", [E, 2 * Im, H]) + bf16(p + "experts.down_proj", [E, H, Im])
        t += bf16(p + "layer_scalar", [1])
    return t


def qwen3_5_moe(c):
    q = c.get("quantization") or {}
    c = c["text_config"]
    H, V, E = c["hidden_size"], c["vocab_size"], c["num_experts"]
    Im, S = c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    mat = (lambda n, s: mlx4(n, s, q["group_size"], q["bits"])) if q else (lambda n, s: bf16(n + ".weight", s))
    p0 = "language_model.model."
    t = mat(p0 + "embed_tokens", [V, H]) + bf16(p0 + "norm.weight", [H]) + mat("language_model.lm_head", [V, H])
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    nv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    for l, kind in enumerate(c["layer_types"]):
        p = p0 + "layers.%d." % l
        t += bf16(p + "input_layernorm.weight", [H]) + bf16(p + "post_attention_layernorm.weight", [H])
        if kind == "full_attention":  # gated attention: q_proj carries the output gate too
            t += mat(p + "self_attn.q_proj", [2 * nh * hd, H]) + mat(p + "self_attn.k_proj", [nkv * hd, H])
            t += mat(p + "self_attn.v_proj", [nkv * hd, H]) + mat(p + "self_attn.o_proj", [H, nh * hd])
            t += bf16(p + "self_attn.q_norm.weight", [hd]) + bf16(p + "self_attn.k_norm.weight", [hd])
        else:  # Gated DeltaNet
            conv = 2 * nk * dk + nv * dv
            t += mat(p + "linear_attn.in_proj_qkv", [conv, H]) + mat(p + "linear_attn.in_proj_z", [nv * dv, H])
            t += mat(p + "linear_attn.in_proj_b", [nv, H]) + mat(p + "linear_attn.in_proj_a", [nv, H])
            t += bf16(p + "linear_attn.conv1d.weight", [conv, 1, c["linear_conv_kernel_dim"]])
            t += bf16(p + "linear_attn.dt_bias", [nv]) + bf16(p + "linear_attn.A_log", [nv])
            t += bf16(p + "linear_attn.norm.weight", [dv]) + mat(p + "linear_attn.out_proj", [H, nv * dv])
        t += mat(p + "mlp.gate", [E, H]) + mat(p + "mlp.shared_expert_gate", [1, H])
        for n, s in (("gate_proj", [S, H]), ("up_proj", [S, H]), ("down_proj", [H, S])):
            t += mat(p + "mlp.shared_expert." + n, s)
        for n, s in (("gate_proj", [E, Im, H]), ("up_proj", [E, Im, H]), ("down_proj", [E, H, Im])):
            t += mat(p + "mlp.switch_mlp." + n, s)
    return t


ARCHITECTURES = {"qwen3_moe": qwen3_moe, "gpt_oss": gpt_oss, "deepseek_v3": deepseek, "deepseek_v2": deepseek, "gemma4": gemma4,
                 "qwen3_5_moe": qwen3_5_moe}
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "U32": 4, "U8": 1, "F8_E4M3": 1}
SHARD_BYTES = 5 << 30


def write(config_dir, out_dir):
    with open(os.path.join(config_dir, "config.json")) as f:
        config = json.load(f)
    tensors = ARCHITECTURES[config["model_type"]](config)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shards, current, size = [], [], 0
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        if current and size + n > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, dtype, shape, n))
        size += n
    shards.append(current)
    total = 0
    for i, shard in enumerate(shards):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape, n in shard:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        path = os.path.join(out_dir, "model-%05d-of-%05d.safetensors" % (i + 1, len(shards)))
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + offset)  # the data: a hole
        total += offset
    return total


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write(sys.argv[1], sys.argv[2]))
