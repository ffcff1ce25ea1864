#!/usr/bin/env python3
"""Creates tierlm's reference fixtures with Hugging Face transformers (run on the device machine).

For each tiny architecture: a random model (fixed seed, weights re-drawn at unit scale so logits are well separated),
saved with save_pretrained (safetensors, f32), plus reference.json holding a prompt (token ids), the logits of every
prompt position, 32 greedy tokens (full re-forward, no cache) and the logits of every greedy step.
Also: MLX affine 4/8-bit versions of one model (weight/scales/biases, group 64) and mlx-community layouts of the
Qwen3.5 MoE, Gemma 4, gpt-oss (MXFP4 experts) and DeepSeek-V3/V2 fixtures, with references computed from the
dequantized weights, and the embedded default model (tools/train_default_model.py).

usage: python3 tools/make_fixtures.py OUT_DIR [--skip-train] [--only NAME,...]
--only writes just the named tiny models (their seeds still come from their place in specs(), so a fixture made alone
equals the one made with all the others; new specs are appended at the end for that reason) and no manifest.
"""
import json
import math
import os
import re
import shutil
import sys
import time

import torch
import transformers
from safetensors.torch import save_file

OUT = sys.argv[1]
SKIP_TRAIN = "--skip-train" in sys.argv
ONLY = None
if "--only" in sys.argv:
    ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(","))
V5 = int(transformers.__version__.split(".")[0]) >= 5
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)


def rope_kwargs(theta, scaling=None):
    if V5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    kw = {"rope_theta": theta}
    if scaling:
        kw["rope_scaling"] = scaling
    return kw


def specs():
    from transformers import (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig, MixtralConfig,
                              OlmoeConfig, Qwen2MoeConfig)
    llama3_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}
    out = {}
    out["llama3"] = LlamaConfig(**COMMON, tie_word_embeddings=False, **rope_kwargs(500000.0, llama3_scaling))
    c = dict(COMMON, num_key_value_heads=4)
    out["smollm"] = LlamaConfig(**c, tie_word_embeddings=True, **rope_kwargs(10000.0))
    out["mistral"] = MistralConfig(**COMMON, tie_word_embeddings=False, sliding_window=None, **rope_kwargs(1e6))
    out["qwen2"] = Qwen2Config(**COMMON, tie_word_embeddings=True, **rope_kwargs(1e6))
    out["qwen3"] = Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True, **rope_kwargs(1e6))
    moe = dict(COMMON)
    out["qwen3_moe"] = Qwen3MoeConfig(**moe, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                      moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                                      mlp_only_layers=[], tie_word_embeddings=False, **rope_kwargs(1e6))
    out["mixtral"] = MixtralConfig(**moe, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                                   sliding_window=None, **rope_kwargs(1e6))
    out["olmoe"] = OlmoeConfig(**moe, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                               tie_word_embeddings=False, **rope_kwargs(10000.0))
    out["qwen2_moe"] = Qwen2MoeConfig(**moe, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64, norm_topk_prob=False,
                                      decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                                      **rope_kwargs(1e6))
    # Appended specs (a spec's seed is its place in this list, so the ones above keep theirs).
    # Sliding-window attention shorter than the 24-token prompt: every later position sees only the last 8.
    out["mistral-swa"] = MistralConfig(**COMMON, tie_word_embeddings=False, sliding_window=8, **rope_kwargs(1e6))
    # qwen2-style: sliding only on layers >= max_window_layers (layer 0 full, 1-2 windowed).
    out["qwen2-swa"] = Qwen2Config(**dict(COMMON, num_hidden_layers=3), tie_word_embeddings=True,
                                   use_sliding_window=True, sliding_window=8, max_window_layers=1,
                                   **rope_kwargs(1e6))
    out["mixtral-swa"] = MixtralConfig(**moe, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                                       sliding_window=8, **rope_kwargs(1e6))
    # llama with biases on q/k/v/o and on the MLP's gate/up/down.
    out["llama-bias"] = LlamaConfig(**COMMON, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                                    **rope_kwargs(10000.0))
    # Dense layers among sparse ones: qwen3_moe by mlp_only_layers (layers 0, 1, 3 sparse, 2 dense), qwen2_moe by
    # decoder_sparse_step (layers 1, 3 sparse) plus mlp_only_layers=[0] (no effect there, read all the same).
    four = dict(moe, num_hidden_layers=4)
    out["qwen3_moe-mixed"] = Qwen3MoeConfig(**four, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                            moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                                            mlp_only_layers=[2], tie_word_embeddings=False, **rope_kwargs(1e6))
    out["qwen2_moe-mixed"] = Qwen2MoeConfig(**four, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                            shared_expert_intermediate_size=64, norm_topk_prob=False,
                                            decoder_sparse_step=2, mlp_only_layers=[0], tie_word_embeddings=False,
                                            **rope_kwargs(1e6))
    # Wave 2 (appended). Each entry is a config, or (config, model class name) when the auto class is not the one a
    # real checkpoint uses. Qwen3.5: Gated DeltaNet + gated full attention hybrid (layer_types), partial rotary.
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig, Qwen3_5MoeTextConfig, Gemma4TextConfig, Gemma4Config
    q35 = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
               linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    q35_rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                                    "mrope_section": [1, 1, 0], "mrope_interleaved": True}}
    tiny_vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       num_position_embeddings=64, patch_size=4)
    # Dense Qwen3.5 as the hub ships it: Qwen3_5ForConditionalGeneration (text under text_config, a vision tower).
    out["qwen3_5"] = (Qwen3_5Config(text_config=dict(q35, tie_word_embeddings=False, **q35_rope),
                                    vision_config=tiny_vision, tie_word_embeddings=False),
                      "Qwen3_5ForConditionalGeneration")
    moe35 = dict(q35, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                 shared_expert_intermediate_size=64)
    out["qwen3_5_moe"] = (Qwen3_5MoeConfig(text_config=dict(moe35, tie_word_embeddings=False, **q35_rope),
                                           vision_config=tiny_vision, tie_word_embeddings=False),
                          "Qwen3_5MoeForConditionalGeneration")
    # Text-only class, another layer pattern (full first), tied embeddings, 6 layers.
    out["qwen3_5_moe-text"] = (Qwen3_5MoeTextConfig(**dict(moe35, num_hidden_layers=6), tie_word_embeddings=True,
                                                    layer_types=["full_attention", "linear_attention",
                                                                 "linear_attention", "full_attention",
                                                                 "linear_attention", "full_attention"], **q35_rope),
                               "Qwen3_5MoeForCausalLM")
    # Gemma 4. 26B-A4B-like: sliding (window 8 < prompt) x5 + full, k_eq_v on full layers with their own head_dim
    # and KV heads, dense MLP + MoE in parallel on every layer, soft-capped logits, no per-layer inputs.
    g4 = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6, sliding_window=8,
              bos_token_id=2, eos_token_id=1, pad_token_id=0, vocab_size_per_layer_input=256)
    out["gemma4-moe"] = (Gemma4TextConfig(**g4, num_hidden_layers=6, global_head_dim=32, num_global_key_value_heads=1,
                                          attention_k_eq_v=True, enable_moe_block=True, num_experts=8,
                                          top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0,
                                          num_kv_shared_layers=0, use_double_wide_mlp=False,
                                          final_logit_softcapping=30.0, tie_word_embeddings=True),
                         "Gemma4ForCausalLM")
    # E2B-like dense: per-layer input embeddings, KV shared by the last layers, double-wide MLP there.
    out["gemma4-dense"] = (Gemma4TextConfig(**g4, num_hidden_layers=6, global_head_dim=32,
                                            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                         "sliding_attention", "sliding_attention", "full_attention"],
                                            attention_k_eq_v=False, enable_moe_block=False,
                                            hidden_size_per_layer_input=16, num_kv_shared_layers=3,
                                            use_double_wide_mlp=True, final_logit_softcapping=30.0,
                                            tie_word_embeddings=True),
                           "Gemma4ForCausalLM")
    # The text tower of a Gemma4ForConditionalGeneration checkpoint (model.language_model.* names, nested config).
    try:
        from transformers import Gemma4VisionConfig
        gv = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16, position_embedding_size=64, patch_size=4)
        gtext = dict(g4, num_hidden_layers=6, global_head_dim=32, num_global_key_value_heads=1,
                     attention_k_eq_v=True, enable_moe_block=True, num_experts=8, top_k_experts=2,
                     moe_intermediate_size=32, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                     final_logit_softcapping=30.0, tie_word_embeddings=True)
        out["gemma4-cg"] = (Gemma4Config(text_config=gtext, vision_config=gv, audio_config=None,
                                         tie_word_embeddings=True), "Gemma4ForConditionalGeneration")
    except Exception as e:  # noqa: BLE001 — reported, the other fixtures go on
        print("gemma4-cg spec failed:", e, flush=True)
    # gpt-oss: alternating sliding (window 8 < prompt) / full layers, attention sinks, YaRN, biased clamped-SwiGLU
    # experts (intermediate a multiple of 32 so the MXFP4 copy below has whole blocks).
    from transformers import GptOssConfig, DeepseekV3Config, DeepseekV2Config
    yarn = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False}}
    out["gpt_oss"] = GptOssConfig(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                  layer_types=["sliding_attention", "full_attention"] * 2, num_local_experts=8,
                                  num_experts_per_tok=2, rms_norm_eps=1e-5, max_position_embeddings=131072,
                                  tie_word_embeddings=False, attention_bias=True, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0, **yarn)
    # DeepSeek-V3: MLA with q LoRA, interleaved rope on the rope part, sigmoid group-limited routing with a score
    # correction bias, routed scaling, a shared expert, the first layer dense.
    ds = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16,
              qk_nope_head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, tie_word_embeddings=False)
    out["deepseek_v3"] = DeepseekV3Config(**ds, q_lora_rank=48, n_shared_experts=1, n_routed_experts=8,
                                          routed_scaling_factor=2.5, n_group=4, topk_group=2, num_experts_per_tok=2,
                                          first_k_dense_replace=1, norm_topk_prob=True, rope_interleave=True,
                                          **rope_kwargs(10000.0))
    # DeepSeek-V2-Lite-like: no q LoRA, greedy top-k softmax routing, two shared experts, first layer dense.
    out["deepseek_v2"] = DeepseekV2Config(**ds, q_lora_rank=None, n_shared_experts=2, n_routed_experts=8,
                                          routed_scaling_factor=1.0, topk_method="greedy", n_group=1, topk_group=1,
                                          num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=False,
                                          **rope_kwargs(10000.0))
    # YaRN as the published DeepSeek configs set it (factor 40 over 4096 original positions; V3 mscale = mscale_all_dim
    # = 1, V2-Lite 0.707 each): inv_freq blended between interpolation and extrapolation, cos/sin times the attention
    # factor, softmax scale times mscale(factor, mscale_all_dim)^2. The v2 variant takes different mscale and
    # mscale_all_dim so that the cos/sin attention factor is not 1.
    def ds_yarn(mscale, mscale_all_dim):
        return {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale_all_dim,
                                    "original_max_position_embeddings": 4096}}
    dsy = dict(ds, max_position_embeddings=163840)
    out["deepseek_v3-yarn"] = DeepseekV3Config(**dsy, q_lora_rank=48, n_shared_experts=1, n_routed_experts=8,
                                               routed_scaling_factor=2.5, n_group=4, topk_group=2,
                                               num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
                                               rope_interleave=True, **ds_yarn(1.0, 1.0))
    out["deepseek_v2-yarn"] = DeepseekV2Config(**dsy, q_lora_rank=None, n_shared_experts=2, n_routed_experts=8,
                                               routed_scaling_factor=1.0, topk_method="greedy", n_group=1,
                                               topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
                                               norm_topk_prob=False, **ds_yarn(0.9, 0.707))
    return out


def redraw(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("scale") or name.endswith("layer_scalar"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


@torch.no_grad()
def reference(model, prompt, steps=32):
    model.eval()
    ids = torch.tensor([prompt])
    logits = model(ids, use_cache=False).logits[0].float()
    prompt_logits = logits.tolist()
    greedy, step_logits, margins = [], [], []
    cur = ids
    last = logits[-1]
    for _ in range(steps):
        top = torch.topk(last, 2)
        margins.append(float(top.values[0] - top.values[1]))
        nxt = int(top.indices[0])
        greedy.append(nxt)
        cur = torch.cat([cur, torch.tensor([[nxt]])], dim=1)
        last = model(cur, use_cache=False).logits[0, -1].float()
        step_logits.append(last.tolist())
    return {"prompt": prompt, "prompt_logits": prompt_logits, "greedy": greedy, "step_logits": step_logits,
            "min_margin": min(margins)}


def compact_floats(obj):
    """Floats to 9 significant digits: exact for the float32 values the references hold, ~40% fewer bytes (the
    device machine takes at most 64 MiB of checkout per call)."""
    if isinstance(obj, float):
        return float(f"{obj:.9g}")
    if isinstance(obj, list):
        return [compact_floats(x) for x in obj]
    if isinstance(obj, dict):
        return {k: compact_floats(v) for k, v in obj.items()}
    return obj


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(compact_floats(obj), f, separators=(",", ":"))


def make_tiny(name, cfg, seed):
    torch.manual_seed(seed)
    cls_name = None
    if isinstance(cfg, tuple):
        cfg, cls_name = cfg
    if cls_name:
        model = getattr(transformers, cls_name)._from_config(cfg, torch_dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    model = model.float()
    redraw(model, seed)
    with torch.no_grad():  # buffers that change the math (DeepSeek-V3's routing bias) get values too
        gb = torch.Generator().manual_seed(seed + 7)
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gb) * 0.1)
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(seed + 1)
    vocab = cfg.get_text_config().vocab_size
    prompt = torch.randint(3, vocab, (24,), generator=g).tolist()
    ref = reference(model, prompt)
    ref["model_type"] = cfg.model_type
    ref["transformers"] = transformers.__version__
    write_json(os.path.join(d, "reference.json"), ref)
    if name.startswith("qwen3_5"):
        add_mtp(d, cfg.get_text_config().hidden_size, g)
    names = {k: list(v.shape) for k, v in model.state_dict().items()}
    print(f"{name}: {sum(p.numel() for p in model.parameters())} params, greedy {ref['greedy'][:8]}..., "
          f"min margin {ref['min_margin']:.4f}", flush=True)
    return model, ref, names


def add_mtp(d, hidden, g):
    """Hub Qwen3.5 checkpoints carry multi-token-prediction tensors that transformers ignores; so does tierlm."""
    from safetensors.torch import load_file
    path = os.path.join(d, "model.safetensors")
    state = load_file(path)
    state["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=g)
    state["mtp.norm.weight"] = torch.ones(hidden)
    state["mtp.layers.0.input_layernorm.weight"] = torch.ones(hidden)
    save_file(state, path, metadata={"format": "pt"})


def make_mlx_qwen35(base_name, model, bits=4, group=64):
    """An mlx-community-style folder of a Qwen3.5 MoE ConditionalGeneration model, laid out as mlx-lm's sanitize
    leaves it: language_model.model.* names, no vision tower or mtp, conv1d as [C, Kc, 1], the (1 + w) norms stored
    shifted by one, experts split into switch_mlp.{gate,up,down}_proj and quantized per expert, the router and the
    shared-expert gate at 8 bits, other floats bf16 (A_log f32). The reference runs the HF model on the dequantized
    values."""
    name = f"{base_name}-mlx{bits}"
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    state, quant = {}, {"group_size": group, "bits": bits, "mode": "affine"}
    shifted = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")

    def mlx_name(k):
        if k.startswith("model.language_model."):
            return "language_model.model." + k[len("model.language_model."):]
        if k.startswith("lm_head."):
            return "language_model." + k
        return None

    def quantize_into(base, v, b):
        return mlx_quantize_into(state, base, v, b, group)

    with torch.no_grad():
        for k, v in model.state_dict().items():
            n = mlx_name(k)
            if n is None:
                continue  # the vision tower
            if k.endswith("mlp.experts.gate_up_proj"):
                I = v.shape[1] // 2
                p = n[: -len("experts.gate_up_proj")] + "switch_mlp."
                dg = quantize_into(p + "gate_proj", v[:, :I, :].contiguous(), bits)
                du = quantize_into(p + "up_proj", v[:, I:, :].contiguous(), bits)
                v.copy_(torch.cat([dg, du], dim=1))
                continue
            if k.endswith("mlp.experts.down_proj"):
                p = n[: -len("experts.down_proj")] + "switch_mlp."
                v.copy_(quantize_into(p + "down_proj", v, bits))
                continue
            if v.dim() == 2 and v.shape[1] % group == 0 and k.endswith(".weight"):
                base = n[: -len(".weight")]
                b = bits
                if k.endswith("mlp.gate.weight") or k.endswith("shared_expert_gate.weight"):
                    b = 8
                    quant[base] = {"group_size": group, "bits": 8}
                v.copy_(quantize_into(base, v, b))
                continue
            if k.endswith("conv1d.weight"):
                w = v.to(torch.bfloat16)
                state[n] = w.permute(0, 2, 1).contiguous()  # [C, 1, Kc] -> [C, Kc, 1]
                v.copy_(w.float())
            elif k.endswith("A_log"):
                state[n] = v.float().contiguous()
            elif k.endswith(shifted) or k == "model.language_model.norm.weight":
                w = (v.float() + 1.0).to(torch.bfloat16)
                state[n] = w.contiguous()
                v.copy_(w.float() - 1.0)
            else:
                w = v.to(torch.bfloat16)
                state[n] = w.contiguous()
                v.copy_(w.float())
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "mlx"})
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(state)}})
    cfg = model.config.to_dict()
    cfg.pop("vision_config", None)
    cfg["quantization"] = quant
    cfg["quantization_config"] = quant
    write_json(os.path.join(d, "config.json"), cfg)
    ref = reference(model, json.load(open(os.path.join(OUT, "models", base_name, "reference.json")))["prompt"])
    ref["model_type"] = model.config.model_type
    write_json(os.path.join(d, "reference.json"), ref)
    print(f"{name}: greedy {ref['greedy'][:8]}..., min margin {ref['min_margin']:.4f}", flush=True)


FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantize(w):
    """OCP MXFP4 as gpt-oss stores it: rows [R, K] in blocks of 32 along K, an E8M0 exponent byte per block (bias
    127), E2M1 nibbles with element 2j in the low nibble. Returns (blocks uint8 [R, K/32, 16], scales uint8
    [R, K/32], dequantized [R, K])."""
    R, K = w.shape
    wb = w.reshape(R, K // 32, 32)
    amax = wb.abs().amax(dim=-1).clamp(min=1e-30)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = wb / torch.pow(2.0, e).unsqueeze(-1)
    lut = torch.tensor(FP4_VALUES[:8])
    idx = (scaled.abs().unsqueeze(-1) - lut).abs().argmin(dim=-1)  # nearest magnitude
    code = idx + torch.where(scaled < 0, 8, 0)
    deq = torch.tensor(FP4_VALUES)[code] * torch.pow(2.0, e).unsqueeze(-1)
    code = code.to(torch.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    scales = (e + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous(), deq.reshape(R, K)


def make_mxfp4_gptoss(base_name, model):
    """gpt-oss as OpenAI's HF checkpoints store it: experts as MXFP4 blocks + scales (rows = output features), expert
    biases, router, attention (with sinks), norms and embeddings in bf16, quantization_config mxfp4. The reference
    runs the HF model on the dequantized values."""
    name = f"{base_name}-mxfp4"
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    state = {}
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
                E, In, Out = v.shape  # transformers holds [E, in, out]; the checkpoint rows are outputs
                rows = v.transpose(1, 2).reshape(E * Out, In).float()
                blocks, scales, deq = mxfp4_quantize(rows)
                state[k + "_blocks"] = blocks.reshape(E, Out, In // 32, 16)
                state[k + "_scales"] = scales.reshape(E, Out, In // 32)
                v.copy_(deq.reshape(E, Out, In).transpose(1, 2))
            else:
                w = v.to(torch.bfloat16)
                state[k] = w.contiguous()
                v.copy_(w.float())
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    cfg["torch_dtype"] = "bfloat16"
    write_json(os.path.join(d, "config.json"), cfg)
    ref = reference(model, json.load(open(os.path.join(OUT, "models", base_name, "reference.json")))["prompt"])
    ref["model_type"] = model.config.model_type
    write_json(os.path.join(d, "reference.json"), ref)
    print(f"{name}: greedy {ref['greedy'][:8]}..., min margin {ref['min_margin']:.4f}", flush=True)


def make_fp8_deepseek(base_name, model, block=128):
    """DeepSeek-V3's FP8 checkpoint layout: every linear weight of the layers (attention projections, dense MLP,
    experts, shared experts; not the router, norms, embeddings or head) as float8_e4m3fn with a float32
    `weight_scale_inv` per 128x128 block (w = fp8 * scale_inv), quantization_config fp8 e4m3 dynamic [128, 128].
    The reference: the dequantized checkpoint loaded back by transformers from f32 safetensors."""
    from safetensors.torch import load_file
    name = f"{base_name}-fp8"
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    src = load_file(os.path.join(OUT, "models", base_name, "model.safetensors"))
    fp8, deq_state = {}, {}
    fmax = torch.finfo(torch.float8_e4m3fn).max
    for k, v in src.items():
        if (v.dim() == 2 and k.startswith("model.layers.") and k.endswith(".weight") and ".mlp.gate." not in k
                and "norm" not in k):
            R, C = v.shape
            br, bc = (R + block - 1) // block, (C + block - 1) // block
            pad = torch.zeros(br * block, bc * block)
            pad[:R, :C] = v.float()
            tiles = pad.reshape(br, block, bc, block)
            amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
            scale_inv = amax / fmax
            q = (tiles / scale_inv[:, None, :, None]).to(torch.float8_e4m3fn)
            deq = (q.float() * scale_inv[:, None, :, None]).reshape(br * block, bc * block)[:R, :C]
            fp8[k] = q.reshape(br * block, bc * block)[:R, :C].contiguous()
            fp8[k[: -len("weight")] + "weight_scale_inv"] = scale_inv.float().contiguous()
            deq_state[k] = deq.contiguous()
        else:
            fp8[k] = v.contiguous()
            deq_state[k] = v.contiguous()
    save_file(fp8, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [block, block]}
    write_json(os.path.join(d, "config.json"), cfg)
    ref = reference_of_state(model, deq_state, base_name, name)
    write_json(os.path.join(d, "reference.json"), ref)
    print(f"{name}: greedy {ref['greedy'][:8]}..., min margin {ref['min_margin']:.4f}", flush=True)


def reference_of_state(model, state, base_name, name):
    """transformers' reference on `state` (f32 tensors under the base fixture's checkpoint names, e.g. the values a
    quantized copy dequantizes to): saved beside the model's config and loaded back with from_pretrained, so the
    reference runs exactly those values; the prompt is the base fixture's."""
    tmp = os.path.join(OUT, "_deq_" + name)
    model.config.save_pretrained(tmp)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(tmp, "model.safetensors"),
              metadata={"format": "pt"})
    deq_model = type(model).from_pretrained(tmp, dtype=torch.float32)
    ref = reference(deq_model, json.load(open(os.path.join(OUT, "models", base_name, "reference.json")))["prompt"])
    ref["model_type"] = model.config.model_type
    ref["transformers"] = transformers.__version__
    shutil.rmtree(tmp)
    return ref


def mlx_quantize_into(state, base, v, bits, group):
    """Quantizes v ([..., rows, cols]: a matrix, or experts stacked on the leading axes) row-wise as MLX does into
    state[base + ".weight" / ".scales" / ".biases"] with bf16 scales and biases; returns the dequantized values."""
    rows = v.reshape(-1, v.shape[-1]).float()
    packed, scales, biases, deq = mlx_quantize(rows, bits, group, torch.bfloat16)
    lead = list(v.shape[:-1])
    state[base + ".weight"] = packed.reshape(lead + [packed.shape[-1]]).contiguous()
    state[base + ".scales"] = scales.reshape(lead + [scales.shape[-1]]).contiguous()
    state[base + ".biases"] = biases.reshape(lead + [biases.shape[-1]]).contiguous()
    return deq.reshape(v.shape)


def mlx_quantize(w, bits, group, scale_dtype=torch.float16):
    """MLX affine quantization: per group of `group` columns, w ~= scale*q + bias, q in [0, 2^bits-1]. Scales and
    biases are rounded to scale_dtype (the dtype the folder stores them in) before q and the dequantized values are
    computed, so the reference is reproducible from the folder."""
    rows, cols = w.shape
    wg = w.reshape(rows, cols // group, group)
    wmin = wg.min(dim=-1, keepdim=True).values
    wmax = wg.max(dim=-1, keepdim=True).values
    levels = (1 << bits) - 1
    scale = ((wmax - wmin) / levels).clamp(min=1e-8)
    scale = scale.to(scale_dtype).float()
    bias = wmin.to(scale_dtype).float()
    q = torch.round((wg - bias) / scale).clamp(0, levels).to(torch.int64)
    deq = (q.float() * scale + bias).reshape(rows, cols)
    per = 32 // bits
    qf = q.reshape(rows, cols // per, per)
    packed = torch.zeros(rows, cols // per, dtype=torch.int64)
    for j in range(per):
        packed |= qf[:, :, j] << (bits * j)
    packed = packed.to(torch.uint32) if hasattr(torch, "uint32") else packed.to(torch.int32)
    return packed, scale.reshape(rows, -1).to(scale_dtype), bias.reshape(rows, -1).to(scale_dtype), deq


def make_mlx(base_name, model, bits, group=64):
    name = f"{base_name}-mlx{bits}"
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    state = {}
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if v.dim() == 2 and v.shape[1] % group == 0:
                packed, scales, biases, deq = mlx_quantize(v.float(), bits, group)
                base = k[: -len(".weight")]
                state[base + ".weight"] = packed.contiguous()
                state[base + ".scales"] = scales.contiguous()
                state[base + ".biases"] = biases.contiguous()
                v.copy_(deq)
            else:
                state[k] = v.half().contiguous()
                v.copy_(v.half().float())
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "mlx"})
    cfg = model.config.to_dict()
    cfg["quantization"] = {"group_size": group, "bits": bits}
    cfg["torch_dtype"] = "float16"
    write_json(os.path.join(d, "config.json"), cfg)
    ref = reference(model, json.load(open(os.path.join(OUT, "models", base_name, "reference.json")))["prompt"])
    ref["model_type"] = model.config.model_type
    write_json(os.path.join(d, "reference.json"), ref)
    print(f"{name}: greedy {ref['greedy'][:8]}..., min margin {ref['min_margin']:.4f}", flush=True)


def train_default_model():
    """The embedded default model: tools/train_default_model.py (a small Qwen3-MoE trained on docstrings and tool
    dialogs) writes OUT/models/tierlm-tiny."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_default_model as tdm
    sys.argv = [sys.argv[0], OUT]
    tdm.main()


def make_mlx_gemma4(base_name, model, bits=4, group=32):
    """An mlx-community-style folder of a Gemma 4 MoE model (from the Gemma4ForCausalLM fixture), laid out as mlx-lm's
    gemma4 sanitize leaves it: model_type gemma4 with the text config nested, language_model.model.* names, the fused
    experts split into experts.switch_glu.{gate,up,down}_proj and quantized per expert (stacked [E, rows, ...]),
    router.proj at 8 bits (recorded per path in "quantization"), every other Linear and the embedding at `bits`, other
    floats (norms, router.scale, per_expert_scale, layer_scalar) bf16. Group 32 so the experts' down_proj (in-dim 32)
    quantizes too. The reference runs the HF model on the dequantized / rounded values."""
    name = f"{base_name}-mlx{bits}"
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    state, quant = {}, {"group_size": group, "bits": bits, "mode": "affine"}

    def quantize_into(base, v, b):
        return mlx_quantize_into(state, base, v, b, group)

    with torch.no_grad():
        for k, v in model.state_dict().items():
            if not k.startswith("model."):
                continue  # lm_head: tied to the embedding
            n = "language_model." + k
            if k.endswith("experts.gate_up_proj"):
                I = v.shape[1] // 2
                p = n[: -len("gate_up_proj")] + "switch_glu."
                dg = quantize_into(p + "gate_proj", v[:, :I, :].contiguous(), bits)
                du = quantize_into(p + "up_proj", v[:, I:, :].contiguous(), bits)
                v.copy_(torch.cat([dg, du], dim=1))
                continue
            if k.endswith("experts.down_proj"):
                p = n[: -len("down_proj")] + "switch_glu."
                v.copy_(quantize_into(p + "down_proj", v, bits))
                continue
            if v.dim() == 2 and v.shape[1] % group == 0 and k.endswith(".weight"):
                base = n[: -len(".weight")]
                b = bits
                if k.endswith("router.proj.weight"):
                    b = 8
                    quant[base] = {"group_size": group, "bits": 8}
                v.copy_(quantize_into(base, v, b))
                continue
            w = v.to(torch.bfloat16)
            state[n] = w.contiguous()
            v.copy_(w.float())
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "mlx"})
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(state)}})
    text = model.config.to_dict()
    for key in ("architectures", "transformers_version", "dtype", "torch_dtype"):
        text.pop(key, None)
    text["model_type"] = "gemma4_text"
    cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
           "vocab_size": text["vocab_size"], "tie_word_embeddings": True, "quantization": quant,
           "quantization_config": quant}
    write_json(os.path.join(d, "config.json"), cfg)
    ref = reference(model, json.load(open(os.path.join(OUT, "models", base_name, "reference.json")))["prompt"])
    ref["model_type"] = "gemma4"
    ref["transformers"] = transformers.__version__
    write_json(os.path.join(d, "reference.json"), ref)
    print(f"{name}: greedy {ref['greedy'][:8]}..., min margin {ref['min_margin']:.4f}", flush=True)


def mlx_mxfp4_into(state, base, v):
    """MLX's "mxfp4" mode (mx.quantize(..., mode="mxfp4"): group 32, no biases) of v ([..., rows, cols], quantized
    row-wise) into state[base + ".weight"] (uint32 [..., rows, cols/8]: the E2M1 codes, element 0 in the low nibble,
    i.e. gpt-oss's blocks viewed as little-endian words) and state[base + ".scales"] (uint8 E8M0 [..., rows,
    cols/32]); returns the dequantized values."""
    rows = v.reshape(-1, v.shape[-1]).float()
    blocks, scales, deq = mxfp4_quantize(rows)
    b = blocks.reshape(rows.shape[0], -1, 4).to(torch.int64)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    lead = list(v.shape[:-1])
    state[base + ".weight"] = words.to(torch.uint32).reshape(lead + [words.shape[-1]]).contiguous()
    state[base + ".scales"] = scales.reshape(lead + [scales.shape[-1]]).contiguous()
    return deq.reshape(v.shape)


def write_mlx_folder(d, state, cfg, quant, ref):
    """The files mlx-lm's save_model / save_config write: one shard with metadata format mlx, its index, config.json
    carrying the quantization dict as both "quantization" and "quantization_config"; plus our reference.json."""
    os.makedirs(d, exist_ok=True)
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "mlx"})
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(state)}})
    cfg["quantization"] = quant
    cfg["quantization_config"] = quant
    write_json(os.path.join(d, "config.json"), cfg)
    write_json(os.path.join(d, "reference.json"), ref)
    print(f"{os.path.basename(d)}: {len(state)} tensors, greedy {ref['greedy'][:8]}..., "
          f"min margin {ref['min_margin']:.4f}", flush=True)


def make_mlx_gpt_oss(base_name, model, bits=4, group=64):
    """gpt-oss as mlx-lm writes it when it converts OpenAI's MXFP4 checkpoint with -q (mlx-community's
    gpt-oss-*-MXFP4-Q4 / -Q8): model.* / lm_head names as in HF; experts split by mlx-lm's sanitize from the
    interleaved gate_up (even output rows gate, odd up) into mlp.experts.{gate,up,down}_proj, kept MXFP4 (top-level
    quantization mode "mxfp4", group 32: uint32 words + uint8 scales, no biases) with their float .bias; every other
    Linear and the embedding affine at `bits` (group 64) and mlp.router at 8 bits, each recorded per module path
    (quantize_model's fine-grained entries); sinks, norms and biases bf16. From the saved base fixture; the
    reference runs transformers on exactly the dequantized values."""
    from safetensors.torch import load_file
    name = f"{base_name}-mlx{bits}"
    src = load_file(os.path.join(OUT, "models", base_name, "model.safetensors"))
    state, deq = {}, {}
    quant = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    with torch.no_grad():
        for k, v in src.items():
            v = v.float()
            if k.endswith("mlp.experts.gate_up_proj"):  # [E, H, 2I] as x @ W; output 2j gate unit j, 2j+1 up
                p = k[: -len("gate_up_proj")]
                rows = v.transpose(1, 2)
                dg = mlx_mxfp4_into(state, p + "gate_proj", rows[:, 0::2, :].contiguous())
                du = mlx_mxfp4_into(state, p + "up_proj", rows[:, 1::2, :].contiguous())
                out = torch.empty_like(rows)
                out[:, 0::2, :] = dg
                out[:, 1::2, :] = du
                deq[k] = out.transpose(1, 2).contiguous()
            elif k.endswith("mlp.experts.down_proj"):  # [E, I, H] as x @ W
                p = k[: -len("down_proj")]
                out = mlx_mxfp4_into(state, p + "down_proj", v.transpose(1, 2).contiguous())
                deq[k] = out.transpose(1, 2).contiguous()
            elif k.endswith("mlp.experts.gate_up_proj_bias"):
                p = k[: -len("gate_up_proj_bias")]
                w = v.to(torch.bfloat16)
                state[p + "gate_proj.bias"] = w[:, 0::2].contiguous()
                state[p + "up_proj.bias"] = w[:, 1::2].contiguous()
                deq[k] = w.float()
            elif k.endswith("mlp.experts.down_proj_bias"):
                w = v.to(torch.bfloat16)
                state[k[: -len("down_proj_bias")] + "down_proj.bias"] = w.contiguous()
                deq[k] = w.float()
            elif v.dim() == 2 and k.endswith(".weight") and v.shape[1] % group == 0:
                base = k[: -len(".weight")]
                b = 8 if k.endswith("mlp.router.weight") else bits
                quant[base] = {"group_size": group, "bits": 8} if b == 8 else \
                    {"group_size": group, "bits": b, "mode": "affine"}
                deq[k] = mlx_quantize_into(state, base, v, b, group)
            else:
                w = v.to(torch.bfloat16)
                state[k] = w.contiguous()
                deq[k] = w.float()
    ref = reference_of_state(model, deq, base_name, name)
    write_mlx_folder(os.path.join(OUT, "models", name), state, model.config.to_dict(), quant, ref)


def make_mlx_deepseek(base_name, model, bits=4, group=32):
    """DeepSeek-V3 / V2 as mlx-lm's deepseek_v3.py / deepseek_v2.py sanitize and quantize_model leave them: model.* /
    lm_head names; experts stacked into mlp.switch_mlp.{gate,up,down}_proj [E, rows, cols]; deepseek_v3 splits
    kv_b_proj per head into the MultiLinear embed_q [heads, kv_lora_rank, qk_nope_head_dim] (its K half transposed)
    and unembed_out [heads, v_head_dim, kv_lora_rank] (its V half); deepseek_v2 keeps kv_b_proj. Every Linear,
    MultiLinear and the embedding whose input dim is a multiple of the group is affine-quantized (group 32, so the
    experts' down_proj quantizes), the others stay bf16 (here q_b_proj and embed_q, as quantize_model skips them);
    the router mlp.gate.weight (a bare parameter in mlx-lm) bf16, e_score_correction_bias f32. The reference runs
    transformers on exactly the dequantized values."""
    from safetensors.torch import load_file
    name = f"{base_name}-mlx{bits}"
    c = model.config
    heads, nope, vd, lora = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
    split_kv_b = c.model_type == "deepseek_v3"
    src = load_file(os.path.join(OUT, "models", base_name, "model.safetensors"))
    state, deq, experts = {}, {}, {}
    quant = {"group_size": group, "bits": bits, "mode": "affine"}

    def quantized_or_float(base, v):
        if v.shape[-1] % group == 0:
            return mlx_quantize_into(state, base, v, bits, group)
        w = v.to(torch.bfloat16)
        state[base + ".weight"] = w.contiguous()
        return w.float()

    with torch.no_grad():
        for k, v in src.items():
            v = v.float()
            m = re.match(r"(model\.layers\.\d+\.mlp\.)experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
            if m:
                experts.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = v
            elif split_kv_b and k.endswith("self_attn.kv_b_proj.weight"):  # per head rows [k_nope | v] over the latent
                p = k[: -len("kv_b_proj.weight")]
                per_head = v.reshape(heads, nope + vd, lora)
                dk = quantized_or_float(p + "embed_q", per_head[:, :nope, :].transpose(1, 2).contiguous())
                dv = quantized_or_float(p + "unembed_out", per_head[:, nope:, :].contiguous())
                deq[k] = torch.cat([dk.transpose(1, 2), dv], dim=1).reshape(heads * (nope + vd), lora)
            elif k.endswith("e_score_correction_bias"):
                state[k] = v.contiguous()
                deq[k] = v
            elif v.dim() == 2 and k.endswith(".weight") and not k.endswith("mlp.gate.weight"):
                deq[k] = quantized_or_float(k[: -len(".weight")], v)
            else:
                w = v.to(torch.bfloat16)
                state[k] = w.contiguous()
                deq[k] = w.float()
        for (prefix, proj), per_expert in experts.items():
            n = len(per_expert)
            d = quantized_or_float(prefix + "switch_mlp." + proj, torch.stack([per_expert[e] for e in range(n)]))
            for e in range(n):
                deq[f"{prefix}experts.{e}.{proj}.weight"] = d[e].contiguous()
    ref = reference_of_state(model, deq, base_name, name)
    write_mlx_folder(os.path.join(OUT, "models", name), state, c.to_dict(), quant, ref)


def main():
    os.makedirs(os.path.join(OUT, "models"), exist_ok=True)
    manifest = {}
    for i, (name, cfg) in enumerate(specs().items()):
        if ONLY is not None and name not in ONLY:
            continue
        try:
            model, ref, names = make_tiny(name, cfg, 1000 + i)
            manifest[name] = names
            if name == "llama3":
                make_mlx(name, model, 4)
                model2, _, _ = make_tiny(name, cfg, 1000 + i)  # fresh copy: make_mlx overwrote weights
                make_mlx(name, model2, 8)
            if name == "qwen3_5_moe":
                make_mlx_qwen35(name, model, 4)
            if name == "gemma4-moe":
                make_mlx_gemma4(name, model, 4)
            if name == "gpt_oss":
                make_mxfp4_gptoss(name, model)
                make_mlx_gpt_oss(name, model)  # from the saved fixture: make_mxfp4_gptoss rewrote the weights
            if name == "deepseek_v3":
                make_fp8_deepseek(name, model)
                make_mlx_deepseek(name, model)
            if name == "deepseek_v2":
                make_mlx_deepseek(name, model)
        except Exception as e:  # keep going: one architecture failing must not lose the others
            import traceback
            traceback.print_exc()
            manifest[name] = {"error": str(e)}
    if ONLY is None:
        write_json(os.path.join(OUT, "models", "manifest.json"), manifest)
    else:
        missing = ONLY - set(specs())
        if missing:
            sys.exit(f"--only: no spec named {', '.join(sorted(missing))}")
        write_json(os.path.join(OUT, "models", "manifest.only.json"), manifest)
    if not SKIP_TRAIN:
        train_default_model()


if __name__ == "__main__":
    main()
