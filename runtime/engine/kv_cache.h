// runtime/engine/kv_cache.h — the key/value cache of one sequence: f32 rows [layer][position][kv_head][head_dim],
// allocated once through the ledger (account "kv") for a fixed capacity. Paged and compressed codecs come later
// behind the same accessors. Never: grow silently past capacity (callers check and report).
#pragma once

#include <cstdint>

#include "runtime/model/config.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

class KVCache {
 public:
  KVCache(const model::ModelConfig& config, int64_t capacity, tiering::Ledger& ledger);

  int64_t capacity() const { return capacity_; }
  int64_t row_size() const { return row_; }  // floats per position per layer (kv_heads * head_dim)
  float* keys(int64_t layer, int64_t pos) { return base(layer, pos, 0); }
  float* values(int64_t layer, int64_t pos) { return base(layer, pos, 1); }
  const float* keys(int64_t layer, int64_t pos) const { return const_cast<KVCache*>(this)->base(layer, pos, 0); }
  const float* values(int64_t layer, int64_t pos) const { return const_cast<KVCache*>(this)->base(layer, pos, 1); }
  uint64_t bytes() const { return storage_.size(); }
  static uint64_t bytes_for(const model::ModelConfig& config, int64_t capacity);

 private:
  float* base(int64_t layer, int64_t pos, int which) {
    return storage_.as<float>() + ((layer * 2 + which) * capacity_ + pos) * row_;
  }
  int64_t capacity_;
  int64_t row_;
  tiering::LedgerBuffer storage_;
};

}  // namespace tierlm::engine
