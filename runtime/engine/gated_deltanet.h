// runtime/engine/gated_deltanet.h — the Gated DeltaNet mixer (qwen3_5 "linear_attention" layers), as transformers
// 5.17's Qwen3_5GatedDeltaNet computes it: one fused projection [qkv | z | b | a], a causal depthwise conv1d (with
// SiLU) over the qkv channels, l2-normalized q and k (q scaled by 1/sqrt(key_head_dim)), beta = sigmoid(b),
// g = -exp(A_log) * softplus(a + dt_bias), the gated delta rule per value head (key heads shared by consecutive
// value heads, as repeat_interleave does), RMSNormGated(core, z) = rms_norm(core) * w * silu(z), then out_proj.
// The recurrence runs token by token (exact; equal to transformers' chunked form up to rounding), so chunked prefill,
// whole prefill and decode give the same state whatever the chunking.
// State: each sequence's KVCache holds the layer's conv window and recurrent state; a row at position 0 starts from
// a cleared state. Owns: projection and activation scratch (ledger account "scratch", sized for max_rows).
// Never: allocate per step, touch a layer that is not gated_deltanet, reorder one sequence's rows.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/engine/kv_cache.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

class GatedDeltaNet {
 public:
  GatedDeltaNet(const model::ModelWeights& weights, kernels::ThreadPool& pool, tiering::Ledger& ledger,
                int64_t max_rows);

  // out (n x hidden) = the mixer's output for the n rows of x (n x hidden, already normed). Row i belongs to the
  // sequence whose state is caches[i], at position positions[i]; one sequence's rows are consecutive and in order.
  void run(int64_t layer, const float* x, int64_t n, std::span<KVCache* const> caches,
           std::span<const int64_t> positions, float* out);

 private:
  const model::ModelWeights& w_;
  kernels::ThreadPool& pool_;
  int64_t max_rows_;
  tiering::LedgerBuffer projected_, mixed_, core_;
  std::vector<int64_t> segment_start_;  // rows where a new sequence begins (plus n at the end)
};

}  // namespace tierlm::engine
