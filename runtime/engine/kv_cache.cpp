#include "runtime/engine/kv_cache.h"

#include <stdexcept>

#include <fmt/format.h>

#include "runtime/kv/attention.h"
#include "runtime/kv/block_codec.h"

namespace tierlm::engine {

namespace {

kv::Codec codec_of(const KVCacheOptions& o, const model::ModelConfig& c, int64_t layer) {
  if (o.per_layer.empty()) return o.codec;
  if (int64_t(o.per_layer.size()) != c.num_layers)
    throw std::invalid_argument(fmt::format("kv cache: {} per-layer codecs given for {} layers", o.per_layer.size(),
                                            c.num_layers));
  return o.per_layer[size_t(layer)];
}

size_t page_bytes_of(const kv::CodecLayout& l, int64_t kv_heads) {
  return (l.head_bytes() * size_t(kv_heads) + 63) & ~size_t(63);
}

kv::CodecLayout layout_of(const KVCacheOptions& o, const model::ModelConfig& c, int64_t layer) {
  const kv::Codec codec = codec_of(o, c, layer);
  if (o.turbo && (codec == kv::Codec::turbo3 || codec == kv::Codec::turbo4))
    return kv::turbo_layout(*o.turbo, int(c.head_dim), codec);
  return kv::layout_for(codec, int(c.head_dim));
}

int64_t blocks_for(int64_t capacity) { return (capacity + kv::kBlockTokens - 1) / kv::kBlockTokens; }

}  // namespace

uint64_t KVCache::bytes_for(const model::ModelConfig& c, int64_t capacity, const KVCacheOptions& o) {
  uint64_t total = 0;
  for (int64_t layer = 0; layer < c.num_layers; ++layer)
    total += page_bytes_of(layout_of(o, c, layer), c.num_kv_heads) *
             uint64_t(blocks_for(capacity));
  return total;
}

double KVCache::bytes_per_token(const model::ModelConfig& c, kv::Codec codec) {
  return double(page_bytes_of(kv::layout_for(codec, int(c.head_dim)), c.num_kv_heads)) / kv::kBlockTokens;
}

KVCache::KVCache(const model::ModelConfig& c, int64_t capacity, tiering::Ledger& ledger, KVCacheOptions options)
    : capacity_(capacity), kv_heads_(c.num_kv_heads), head_dim_(c.head_dim), blocks_(blocks_for(capacity)) {
  if (capacity <= 0) throw std::invalid_argument("kv cache: capacity must be positive");
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    layouts_.push_back(layout_of(options, c, layer));
    page_bytes_.push_back(page_bytes_of(layouts_.back(), kv_heads_));
    pools_.push_back(std::make_unique<kv::PagePool>(ledger, layouts_.back().codec, page_bytes_.back(), blocks_));
    pages_.emplace_back();
    for (int64_t b = 0; b < blocks_; ++b) pages_.back().push_back(pools_.back()->allocate());
  }
}

KVCache::~KVCache() {
  for (size_t layer = 0; layer < pools_.size(); ++layer)
    for (uint8_t* p : pages_[layer]) pools_[layer]->release(p);
}

uint64_t KVCache::bytes() const {
  uint64_t total = 0;
  for (auto& p : pools_) total += p->bytes();
  return total;
}

uint8_t* KVCache::page(int64_t layer, int64_t pos) {
  if (pos < 0 || pos >= capacity_)
    throw std::out_of_range(fmt::format("kv cache: position {} outside capacity {}", pos, capacity_));
  return pages_[size_t(layer)][size_t(pos / kv::kBlockTokens)];
}

void KVCache::store_head(int64_t layer, int64_t pos, int64_t kv_head, const float* k, const float* v) {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  uint8_t* region = page(layer, pos) + size_t(kv_head) * l.head_bytes();
  const int slot = int(pos % kv::kBlockTokens);
  kv::encode_key(l, region, slot, k);
  kv::encode_value(l, region + l.key_bytes, slot, v);
}

void KVCache::store(int64_t layer, int64_t pos, const float* k, const float* v) {
  for (int64_t h = 0; h < kv_heads_; ++h) store_head(layer, pos, h, k + h * head_dim_, v + h * head_dim_);
}

void KVCache::attend(int64_t layer, int64_t kv_head, const float* q, int64_t heads, int64_t len, float* out) const {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  kv::attend(l, pages_[size_t(layer)].data(), size_t(kv_head) * l.head_bytes(), len, q, int(heads), out);
}

void KVCache::load_key(int64_t layer, int64_t pos, int64_t kv_head, float* k) const {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  const uint8_t* region = pages_[size_t(layer)][size_t(pos / kv::kBlockTokens)] + size_t(kv_head) * l.head_bytes();
  kv::decode_key(l, region, int(pos % kv::kBlockTokens), k);
}

void KVCache::load_value(int64_t layer, int64_t pos, int64_t kv_head, float* v) const {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  const uint8_t* region = pages_[size_t(layer)][size_t(pos / kv::kBlockTokens)] + size_t(kv_head) * l.head_bytes();
  kv::decode_value(l, region + l.key_bytes, int(pos % kv::kBlockTokens), v);
}

}  // namespace tierlm::engine
