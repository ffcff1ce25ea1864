// runtime/engine/kv_cache.h — the key/value cache of one sequence: per layer, a table of fixed-size pages
// (kv::kBlockTokens positions, every kv head) in that layer's codec (f32, f16, q8, turbo3, turbo4; see
// runtime/kv/codec.h), taken from page pools charged to the ledger (account "kv") for the whole capacity up front,
// so a step can never fail half-way for memory. Attention runs on the pages directly (kv::attend).
// Sliding-window layers (LayerSpec::window) keep a ring of pages bounded to the window plus one chunk
// (kv::StateSpec says how many), so a long context costs memory only on full-attention layers; their attention
// sees the last `window` positions, the query's own included, as transformers' sliding mask does.
// Recurrent layers (Gated DeltaNet) hold no pages but a fixed conv + recurrent state (ledger account "kv" too), which
// folds positions [0, recurrent_position()) in: it cannot be rewound, so only a chunk that starts there or at 0
// (a fresh sequence: the mixer clears the state) may run, and a prefix can be reused only when it ends exactly there.
// MLA layers (DeepSeek) hold one f32 row per position: the normalized latent and the roped key (kv::StateSpec's
// latent_floats), charged to "kv" for the whole capacity up front; other KV codecs are refused for them by name.
// Never: grow silently past capacity (callers check and report), decompress whole layers, take a chunk longer than
// max_chunk() (a windowed ring would overwrite positions the chunk's first queries still see); hold state for the
// layers that run on the GPU (KVCacheOptions::first_layer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/kv/codec.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/config.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

struct KVCacheOptions {
  kv::Codec codec = kv::default_codec();
  std::vector<kv::Codec> per_layer;  // when not empty: one codec per layer (the plan may mix them)
  std::optional<kv::TurboSpec> turbo;  // quality studies: other bit widths for the turbo layers
  // The longest chunk a forward pass writes at once (the prefill chunk); 0: the capacity. Sizes windowed rings.
  int64_t max_chunk = 0;
  // Layers [0, first_layer) run elsewhere (Forward's GPU layers, whose device KV and states GpuLayers keeps): the
  // cache holds no pages, ring or state for them (bytes_for counts none either). A held layer that shares the KV of
  // a layer below first_layer is refused.
  int64_t first_layer = 0;
};

class KVCache {
 public:
  KVCache(const model::ModelConfig& config, int64_t capacity, tiering::Ledger& ledger, KVCacheOptions options = {});
  ~KVCache();
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  KVCache(KVCache&&) noexcept = default;
  KVCache& operator=(KVCache&&) noexcept = default;  // the old pools go back to the ledger

  int64_t capacity() const { return capacity_; }
  int64_t max_chunk() const { return max_chunk_; }
  int64_t row_size() const { return kv_heads_ * head_dim_; }  // the model's kv_heads * head_dim (layers may differ)
  kv::Codec codec(int64_t layer) const { return layouts_[size_t(layer)].codec; }
  const kv::CodecLayout& layout(int64_t layer) const { return layouts_[size_t(layer)]; }

  // Writes position pos of a layer: k and v hold the layer's kv_heads * head_dim floats. A KV-shared layer
  // (LayerSpec::kv_source) stores nothing: its attend() reads its source layer's pages.
  void store(int64_t layer, int64_t pos, const float* k, const float* v);
  // One kv head only (k, v: head_dim floats). Different positions/heads may be stored concurrently.
  void store_head(int64_t layer, int64_t pos, int64_t kv_head, const float* k, const float* v);
  // Attention of `heads` query heads (q: heads * head_dim floats, unscaled) that share kv_head, for the query at
  // position len - 1: over positions [0, len) of the layer, or its last `window` of them on a windowed layer;
  // out: heads * head_dim floats. Safe to call concurrently (read-only).
  // sinks: per query head, a logit in the softmax denominator (gpt-oss), or null.
  void attend(int64_t layer, int64_t kv_head, const float* q, int64_t heads, int64_t len, float* out,
              const float* sinks = nullptr) const;
  // What the codec stored for one position and head (tests and quality studies).
  void load_key(int64_t layer, int64_t pos, int64_t kv_head, float* k) const;
  void load_value(int64_t layer, int64_t pos, int64_t kv_head, float* v) const;
  // Forward announces each chunk's end before writing it, so the cache knows the furthest position it has held.
  void will_write(int64_t end) { written_ = std::max(written_, end); }
  // Whether a new sequence may keep positions [0, prefix) (prefix reuse): a windowed ring must still hold the window
  // that ends at prefix, given everything written since. Full-attention layers always do.
  bool holds_prefix(int64_t prefix) const;

  // Recurrent layers (LayerSpec::mixer == gated_deltanet): the layer's conv window (conv_dim x (kernel - 1) floats,
  // per channel oldest first) and its recurrent state (value_heads x key_head_dim x value_head_dim floats).
  bool has_recurrent() const { return has_recurrent_; }
  float* conv_state(int64_t layer) { return states_[size_t(layer)].as<float>(); }
  float* recurrent_state(int64_t layer) { return states_[size_t(layer)].as<float>() + conv_floats_; }
  // The positions the recurrent states have folded in; Forward sets it when a chunk [pos, end) is accepted.
  int64_t recurrent_position() const { return recurrent_position_; }
  void will_fold(int64_t end) { recurrent_position_ = end; }
  // Whether a chunk may start at pos: always, unless recurrent states would have to skip or rewind positions.
  bool can_start_at(int64_t pos) const { return !has_recurrent_ || pos == 0 || pos == recurrent_position_; }

  // MLA layers (LayerSpec::mixer == mla): the row of position pos, [latent (kv_lora_rank) | roped key (rope dims)],
  // and all rows of the layer (row t at t * latent_floats).
  float* latent_row(int64_t layer, int64_t pos);
  const float* latent_rows(int64_t layer) const { return latents_[size_t(layer)].as<float>(); }

  uint64_t bytes() const;
  uint64_t windowed_bytes() const;  // the part held by sliding-window layers (their rings)
  uint64_t recurrent_bytes() const;  // the part held by recurrent layers (their states)
  // What bytes_for would be if every layer kept every position (the saving windowed layers make is the difference).
  static uint64_t bytes_without_windows(const model::ModelConfig& config, int64_t capacity,
                                        const KVCacheOptions& options = {});
  static uint64_t bytes_for(const model::ModelConfig& config, int64_t capacity, const KVCacheOptions& options = {});
  // Bytes of one position of one full-attention layer in a codec (all kv heads), page overhead included.
  static double bytes_per_token(const model::ModelConfig& config, kv::Codec codec);

 private:
  uint8_t* page(int64_t layer, int64_t pos);
  const uint8_t* page(int64_t layer, int64_t pos) const;
  int64_t capacity_;
  int64_t max_chunk_;
  int64_t written_ = 0;  // positions [0, written_) have been written at least once
  int64_t kv_heads_;
  int64_t head_dim_;
  std::vector<int64_t> windows_;                       // per layer: 0 (full) or the window
  std::vector<int64_t> storage_;                       // per layer: the layer whose pages it uses (itself or kv_source)
  std::vector<int64_t> layer_kv_heads_, layer_head_dim_;
  std::vector<int64_t> ring_;                          // per layer: pages held (all of the capacity, or the ring)
  std::vector<kv::CodecLayout> layouts_;
  std::vector<size_t> page_bytes_;
  std::vector<std::unique_ptr<kv::PagePool>> pools_;   // one per layer; null for KV-shared layers
  std::vector<std::vector<uint8_t*>> pages_;           // [layer][block % ring]
  std::vector<tiering::LedgerBuffer> states_;          // per layer: the recurrent state, empty for attention layers
  std::vector<tiering::LedgerBuffer> latents_;         // per layer: MLA rows (capacity x latent floats), else empty
  std::vector<int64_t> latent_floats_;
  int64_t conv_floats_ = 0;
  bool has_recurrent_ = false;
  int64_t recurrent_position_ = 0;
};

}  // namespace tierlm::engine
