// runtime/engine/forward.h — the forward pass of a decoder over a chunk of tokens of one sequence (or a batch).
// One code path for every architecture in the table: it walks the config's LayerSpecs (runtime/model/layer_spec.h);
// the mixer of each layer is full or sliding-window attention over the sequence's KVCache (optionally with qwen3_5's
// output gate; with the layer's own head_dim and KV heads, or another layer's KV), the GatedDeltaNet unit, whose
// state the KVCache also holds, or DeepSeek's MlaAttention over the cache's latent rows; the MLP is dense or the
// MoeBlock. The ArchitectureSpec switches qkv bias and q/k norm; config biases add o/MLP biases; Gemma 4's block
// (sandwich norms, the dense MLP beside the experts, per-layer inputs, layer scalar, soft-capped logits) is the
// feed_forward_gemma4 / per-layer-input path.
// n == 1 (decode) uses matvec; n > 1 (prefill) uses matmul so each weight is read once per chunk.
// Owns: scratch activations and the kernels' MatmulScratch (ledger account "scratch", both sized for max_chunk
// tokens at construction; the MatmulScratch is the calling thread's for the length of a step). Never: allocate per
// step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/engine/gated_deltanet.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/engine/mla.h"
#include "runtime/engine/moe.h"
#include "runtime/engine/ops.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::gpu {
class GpuLayers;
}

namespace tierlm::engine {

// One sequence's part of a batched step: its tokens at positions [pos, pos + tokens.size()) in its own cache.
struct BatchItem {
  std::span<const int32_t> tokens;
  int64_t pos = 0;
  KVCache* cache = nullptr;
  float* logits = nullptr;  // vocab floats for the last token, or tokens.size() * vocab when all_logits
  bool all_logits = false;
  // Greedy decoding: when set, the last token's argmax (engine::argmax of its logits) is written here. Unless
  // all_logits, `logits` is then scratch that may be left unwritten: when the GPU runs the head, the logits are
  // reduced on the device and only the token id comes back.
  int32_t* greedy = nullptr;
};

class Forward {
 public:
  Forward(const model::ModelWeights& weights, kernels::ThreadPool& pool, tiering::Ledger& ledger,
          int64_t max_chunk, int64_t max_context);

  // Runs tokens at positions [pos, pos + n) (n <= max_chunk, pos + n <= cache capacity), filling the cache.
  // logits: vocab floats for the last token, or n * vocab when all_logits.
  void run(std::span<const int32_t> tokens, int64_t pos, KVCache& cache, float* logits, bool all_logits = false);
  // Several sequences in one pass (continuous batching): every weight is read once for all their rows.
  // The total number of tokens must not exceed max_chunk.
  void run_batch(std::span<const BatchItem> items);

  int64_t max_chunk() const { return max_chunk_; }
  const model::ModelWeights& weights() const { return w_; }
  MoeBlock* moe() { return moe_.get(); }  // null for models without sparse layers
  uint64_t matmul_scratch_bytes() const { return matmul_scratch_.bytes(); }
  // Runs layers [0, gpu->layers()) (and the head, when gpu->runs_head()) on the GPU from now on; null: CPU only.
  void use_gpu(std::shared_ptr<gpu::GpuLayers> gpu);
  gpu::GpuLayers* gpu() { return gpu_.get(); }

 private:
  void attention(int64_t layer, int64_t n);
  void feed_forward(int64_t layer, int64_t n);
  void feed_forward_gemma4(int64_t layer, int64_t n);
  // Gemma 4 per-layer inputs of the step's rows (ple_: rows x layers x P), from their tokens and embeddings.
  void per_layer_inputs(std::span<const BatchItem> items, int64_t n);
  void per_layer_input(int64_t layer, int64_t n);
  void head(std::span<const BatchItem> items);
  template <class Fn>
  void per_row(int64_t n, Fn&& fn);

  const model::ModelWeights& w_;
  kernels::ThreadPool& pool_;
  int64_t max_chunk_;
  int64_t max_context_;
  std::vector<model::LayerSpec> specs_;  // config.layer(i) for every layer
  std::vector<Rope> ropes_;               // per layer: its type's RoPE at its head_dim
  tiering::Ledger& ledger_;
  kernels::MatmulScratch matmul_scratch_;  // what matvec/matmul of max_chunk rows by any of the weights take
  tiering::LedgerBuffer hidden_, normed_, qkv_, attn_, gate_, ffn_, ffn_act_, logits_;
  int64_t qkv_stride_ = 0;  // floats of one row of the fused attention projection
  std::unique_ptr<GatedDeltaNet> deltanet_;  // the mixer of gated_deltanet layers
  std::unique_ptr<MlaAttention> mla_;        // the mixer of mla layers
  // Gemma 4: k_eq_v values, the MLP and MoE outputs, the router input, per-layer inputs (rows x layers x P) and the
  // per-layer token embeddings, the PLE gate.
  tiering::LedgerBuffer values_, mlp_out_, moe_out_, router_in_, ple_, ple_tokens_, ple_gate_;
  std::unique_ptr<MoeBlock> moe_;  // the sparse MLP of the layers whose LayerSpec says moe
  // Per row of the current batch: its cache and absolute position.
  std::vector<KVCache*> row_cache_;
  std::vector<int64_t> row_pos_;
  std::shared_ptr<gpu::GpuLayers> gpu_;
  std::vector<const void*> gpu_keys_;  // the device KV of a row's sequence is keyed by its KVCache
  std::vector<int32_t> gpu_head_rows_;
  std::vector<float*> gpu_head_out_;
  std::vector<int32_t> gpu_head_ids_;
  std::vector<int32_t> step_tokens_;   // the step's token ids, when the GPU looks up their embeddings
};

}  // namespace tierlm::engine
