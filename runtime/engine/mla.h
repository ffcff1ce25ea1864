// runtime/engine/mla.h — the multi-head latent attention mixer of DeepSeek-V2/V3 (LayerSpec::mixer == mla), as
// transformers 5.17's DeepseekV3Attention / DeepseekV2Attention define it, computed in the absorbed form:
//   [q_a | kv_a] = mla_in · x;  q = q_b · rms_norm(q_a)  (or q_proj · x without q LoRA);  per head q = [nope | rope]
//   latent = rms_norm(kv_a[:kv_lora_rank]);  k_rope = RoPE(kv_a[kv_lora_rank:])  (one key shared by every head)
//   the cache keeps (latent, k_rope) per position and nothing per head;
//   per head h: q_latent = W_uk[h]ᵀ q_nope  (kv_b_proj's K half absorbs the query into latent space)
//     score_t = (q_latent · latent_t + RoPE(q_rope) · k_rope_t) * softmax_scale
//     out_h = W_uv[h] · Σ_t softmax(score)_t latent_t  (kv_b_proj's V half applied once to the mixed latent)
//   o_proj over the heads' outputs.
// This equals the definition's k_nope = W_uk latent, v = W_uv latent attention by associativity; prefill and decode
// use the same form, so chunked prefill, whole prefill and decode agree. RoPE's interleaved pairs were turned into
// rotate_half order at load (runtime/model/mla_weights.h).
// Owns: projection and per-thread scratch (ledger account "scratch", sized for max_rows). Never: allocate per step,
// touch a layer that is not mla, read a position a row's causal mask hides.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/engine/kv_cache.h"
#include "runtime/engine/ops.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

class MlaAttention {
 public:
  MlaAttention(const model::ModelWeights& weights, kernels::ThreadPool& pool, tiering::Ledger& ledger,
               int64_t max_rows);

  // out (n x hidden) = the mixer's output for the n rows of x (n x hidden, already normed); out may alias x. Row i
  // belongs to the sequence whose cache is caches[i], at position positions[i]; every row's latent is stored before
  // any row attends, so a row sees its own position and every earlier one of its sequence.
  void run(int64_t layer, const float* x, int64_t n, std::span<KVCache* const> caches,
           std::span<const int64_t> positions, float* out);

 private:
  const model::ModelWeights& w_;
  kernels::ThreadPool& pool_;
  int64_t max_rows_;
  Rope rope_;
  tiering::LedgerBuffer projected_, q_a_, q_, heads_out_, work_;
};

}  // namespace tierlm::engine
