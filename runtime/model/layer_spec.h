// runtime/model/layer_spec.h — the per-layer model description: what each decoder layer mixes tokens with (full
// attention, sliding-window attention with its window, Gated DeltaNet linear attention, MLA) and which MLP it has
// (dense, or the MoE block whose experts live in the expert tier). Config parsing expands the family row into one
// LayerSpec per layer; the forward pass, the KV cache, the GPU backend and the planner walk these instead of
// family-wide flags. Each mixer kind is one unit in runtime/engine/ owning its per-sequence state through the
// sequence's KVCache: paged KV (attention), a windowed ring (sliding_attention), fixed conv + recurrent state
// (gated_deltanet), or a latent row per position (mla).
// Never: hold weights or per-sequence state (a LayerSpec is data; its state_spec() says what the state costs).
#pragma once

#include <cstdint>

#include "runtime/kv/state_spec.h"

namespace tierlm::model {

enum class Mixer : uint8_t {
  attention,          // causal attention over every earlier position
  sliding_attention,  // causal attention over the last `window` positions, the query's own included
  gated_deltanet,     // Gated DeltaNet linear attention (qwen3_5 "linear_attention"): causal conv1d + gated delta
                      // rule recurrence; fixed per-sequence state whatever the context
  mla,                // DeepSeek-V2/V3 multi-head latent attention: per position the cache holds one normalized
                      // latent (kv_lora_rank) and one roped key (qk_rope_head_dim) shared by every head
};

enum class Mlp : uint8_t {
  dense,  // gate/up/down of intermediate_size
  moe,    // router + experts (+ shared expert where the family has one)
};

const char* mixer_name(Mixer m);
const char* mlp_name(Mlp m);

struct LayerSpec {
  Mixer mixer = Mixer::attention;
  int64_t window = 0;        // sliding_attention: positions a query sees; 0 otherwise
  Mlp mlp = Mlp::dense;
  int64_t expert_layer = -1; // moe: this layer's index in the expert tier (sparse layers numbered in order)
  // Attention shape of this layer; 0 means the model's (ModelConfig::layer() fills them in). Gemma 4's full-attention
  // layers have their own head_dim and KV heads.
  int64_t head_dim = 0;
  int64_t kv_heads = 0;
  // KV sharing (gemma4 num_kv_shared_layers): this layer stores no KV and attends over layer kv_source's; -1: its own.
  int64_t kv_source = -1;
  bool k_eq_v = false;       // values are the keys' projection (gemma4 attention_k_eq_v on full layers): no v_proj
  int64_t intermediate = 0;  // dense MLP width; 0 means the model's intermediate_size (gemma4 double-wide layers)
  bool full_rope = false;    // RoPE from ModelConfig::full_attention_rope (gemma4 per-layer-type rope_parameters)

  bool operator==(const LayerSpec&) const = default;
};

}  // namespace tierlm::model
