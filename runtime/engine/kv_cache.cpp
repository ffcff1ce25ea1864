#include "runtime/engine/kv_cache.h"

namespace tierlm::engine {

uint64_t KVCache::bytes_for(const model::ModelConfig& c, int64_t capacity) {
  return uint64_t(c.num_layers) * 2 * uint64_t(capacity) * uint64_t(c.num_kv_heads * c.head_dim) * sizeof(float);
}

KVCache::KVCache(const model::ModelConfig& c, int64_t capacity, tiering::Ledger& ledger)
    : capacity_(capacity),
      row_(c.num_kv_heads * c.head_dim),
      storage_(ledger, tiering::accounts::kv, bytes_for(c, capacity)) {}

}  // namespace tierlm::engine
