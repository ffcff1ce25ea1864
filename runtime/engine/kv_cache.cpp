#include "runtime/engine/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

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

kv::CodecLayout layout_of(const KVCacheOptions& o, const model::ModelConfig& c, int64_t layer) {
  const kv::Codec codec = codec_of(o, c, layer);
  const int head_dim = int(c.layer(layer).head_dim);
  if (c.layer(layer).mixer == model::Mixer::mla) return kv::CodecLayout{};  // f32 latent rows, no pages
  if (o.turbo && (codec == kv::Codec::turbo3 || codec == kv::Codec::turbo4))
    return kv::turbo_layout(*o.turbo, head_dim, codec);
  return kv::layout_for(codec, head_dim);
}

int64_t chunk_of(const KVCacheOptions& o, int64_t capacity) {
  return o.max_chunk > 0 ? std::min(o.max_chunk, capacity) : capacity;
}

}  // namespace

uint64_t KVCache::bytes_for(const model::ModelConfig& c, int64_t capacity, const KVCacheOptions& o) {
  uint64_t total = 0;
  for (int64_t layer = std::max<int64_t>(0, o.first_layer); layer < c.num_layers; ++layer)
    total += c.state_spec(layer).bytes(layout_of(o, c, layer), capacity, chunk_of(o, capacity));
  return total;
}

uint64_t KVCache::bytes_without_windows(const model::ModelConfig& c, int64_t capacity, const KVCacheOptions& o) {
  model::ModelConfig full = c;
  for (auto& l : full.layers) {
    if (l.mixer != model::Mixer::sliding_attention) continue;
    l.mixer = model::Mixer::attention;
    l.window = 0;
  }
  return bytes_for(full, capacity, o);
}

double KVCache::bytes_per_token(const model::ModelConfig& c, kv::Codec codec) {
  return kv::StateSpec{c.num_kv_heads, c.head_dim, 0}.bytes_per_token(kv::layout_for(codec, int(c.head_dim)));
}

KVCache::KVCache(const model::ModelConfig& c, int64_t capacity, tiering::Ledger& ledger, KVCacheOptions options)
    : capacity_(capacity), max_chunk_(chunk_of(options, capacity)), kv_heads_(c.num_kv_heads), head_dim_(c.head_dim),
      conv_floats_(c.deltanet.conv_state_floats()) {
  if (capacity <= 0) throw std::invalid_argument("kv cache: capacity must be positive");
  // A layer without pages of its own here (on the GPU, or MLA: f32 latent rows).
  auto pageless = [&](int64_t layer, int64_t kv_heads, int64_t head_dim) {
    storage_.push_back(layer);
    layer_kv_heads_.push_back(kv_heads);
    layer_head_dim_.push_back(head_dim);
    layouts_.push_back(kv::CodecLayout{});
    windows_.push_back(0);
    pages_.emplace_back();
    page_bytes_.push_back(0);
    ring_.push_back(0);
    pools_.push_back(nullptr);
  };
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const model::LayerSpec spec = c.layer(layer);
    const kv::StateSpec state = c.state_spec(layer);
    states_.emplace_back();
    latents_.emplace_back();
    if (layer < options.first_layer) {  // runs on the GPU: nothing here (recurrent positions are still tracked)
      has_recurrent_ |= state.recurrent();
      latent_floats_.push_back(0);
      pageless(layer, spec.kv_heads, spec.head_dim);
      continue;
    }
    if (state.recurrent()) {
      // Cleared by the mixer when a sequence starts at position 0; zeroed here so a fresh cache reads as empty too.
      states_.back() = tiering::LedgerBuffer(ledger, tiering::accounts::kv, state.recurrent_bytes);
      std::fill_n(states_.back().as<uint8_t>(), state.recurrent_bytes, uint8_t(0));
      has_recurrent_ = true;
    }
    latent_floats_.push_back(state.latent_floats);
    if (state.latent()) {
      if (const kv::Codec codec = codec_of(options, c, layer); codec != kv::Codec::f32)
        throw std::invalid_argument(fmt::format("kv cache: KV codec '{}' is not supported on MLA layers (layer {} "
                                                "keeps its latent rows in f32; use --kv-codec f32)",
                                                kv::codec_name(codec), layer));
      latents_.back() = tiering::LedgerBuffer(ledger, tiering::accounts::kv, state.bytes({}, capacity_, max_chunk_));
      pageless(layer, 0, spec.head_dim);  // f32, no pages
      continue;
    }
    // A KV-shared layer (gemma4 num_kv_shared_layers) reads its source's pages and stores nothing.
    const int64_t storage = spec.kv_source >= 0 ? spec.kv_source : layer;
    if (storage < options.first_layer)
      throw std::invalid_argument(fmt::format("kv cache: layer {} shares the KV of layer {}, which runs on the GPU "
                                              "(first_layer {}): put both on the same side", layer, storage,
                                              options.first_layer));
    if (storage > layer || (storage < layer && storage_[size_t(storage)] != storage))
      throw std::invalid_argument(fmt::format("kv cache: layer {} shares the KV of layer {}, which is not an earlier "
                                              "layer with its own", layer, storage));
    storage_.push_back(storage);
    layer_kv_heads_.push_back(spec.kv_heads);
    layer_head_dim_.push_back(spec.head_dim);
    layouts_.push_back(layout_of(options, c, storage));
    windows_.push_back(state.window);
    pages_.emplace_back();
    if (storage != layer) {
      page_bytes_.push_back(0);
      ring_.push_back(ring_[size_t(storage)]);
      pools_.push_back(nullptr);
      continue;
    }
    page_bytes_.push_back(state.page_bytes(layouts_.back()));
    ring_.push_back(state.pages(capacity_, max_chunk_));
    pools_.push_back(std::make_unique<kv::PagePool>(ledger, layouts_.back().codec, page_bytes_.back(), ring_.back()));
    for (int64_t b = 0; b < ring_.back(); ++b) pages_.back().push_back(pools_.back()->allocate());
  }
}

KVCache::~KVCache() {
  for (size_t layer = 0; layer < pools_.size(); ++layer)
    for (uint8_t* p : pages_[layer]) pools_[layer]->release(p);
}

float* KVCache::latent_row(int64_t layer, int64_t pos) {
  if (pos < 0 || pos >= capacity_)
    throw std::out_of_range(fmt::format("kv cache: position {} outside capacity {}", pos, capacity_));
  return latents_[size_t(layer)].as<float>() + pos * latent_floats_[size_t(layer)];
}

uint64_t KVCache::bytes() const {
  uint64_t total = recurrent_bytes();
  for (auto& l : latents_) total += l.size();
  for (auto& p : pools_)
    if (p) total += p->bytes();
  return total;
}

uint64_t KVCache::recurrent_bytes() const {
  uint64_t total = 0;
  for (auto& s : states_) total += s.size();
  return total;
}

uint64_t KVCache::windowed_bytes() const {
  uint64_t total = 0;
  for (size_t l = 0; l < pools_.size(); ++l)
    if (windows_[l] > 0 && pools_[l]) total += pools_[l]->bytes();
  return total;
}

uint8_t* KVCache::page(int64_t layer, int64_t pos) {
  return const_cast<uint8_t*>(std::as_const(*this).page(layer, pos));
}

const uint8_t* KVCache::page(int64_t layer, int64_t pos) const {
  if (pos < 0 || pos >= capacity_)
    throw std::out_of_range(fmt::format("kv cache: position {} outside capacity {}", pos, capacity_));
  const size_t storage = size_t(storage_[size_t(layer)]);
  return pages_[storage][size_t((pos / kv::kBlockTokens) % ring_[storage])];
}

bool KVCache::holds_prefix(int64_t prefix) const {
  if (prefix <= 0) return true;
  if (has_recurrent_ && prefix != recurrent_position_) return false;
  const int64_t last_page = (std::max(written_, prefix) - 1) / kv::kBlockTokens;
  for (size_t layer = 0; layer < windows_.size(); ++layer) {
    if (windows_[layer] == 0) continue;
    // The ring holds pages (last_page - ring, last_page]; the window ending at prefix starts at prefix - window + 1.
    const int64_t first_needed = std::max<int64_t>(0, prefix - windows_[layer] + 1) / kv::kBlockTokens;
    if (first_needed <= last_page - ring_[layer]) return false;
  }
  return true;
}

void KVCache::store_head(int64_t layer, int64_t pos, int64_t kv_head, const float* k, const float* v) {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  uint8_t* region = page(layer, pos) + size_t(kv_head) * l.head_bytes();
  const int slot = int(pos % kv::kBlockTokens);
  kv::encode_key(l, region, slot, k);
  kv::encode_value(l, region + l.key_bytes, slot, v);
}

void KVCache::store(int64_t layer, int64_t pos, const float* k, const float* v) {
  if (storage_[size_t(layer)] != layer)
    throw std::logic_error(fmt::format("kv cache: layer {} shares layer {}'s KV and stores none", layer,
                                       storage_[size_t(layer)]));
  const int64_t heads = layer_kv_heads_[size_t(layer)], d = layer_head_dim_[size_t(layer)];
  for (int64_t h = 0; h < heads; ++h) store_head(layer, pos, h, k + h * d, v + h * d);
}

void KVCache::attend(int64_t layer, int64_t kv_head, const float* q, int64_t heads, int64_t len, float* out,
                     const float* sinks) const {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  const int64_t window = windows_[size_t(layer)];
  const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
  const size_t storage = size_t(storage_[size_t(layer)]);
  kv::attend(l, pages_[storage].data(), ring_[storage], size_t(kv_head) * l.head_bytes(), start, len, q, int(heads),
             out, sinks);
}

void KVCache::load_key(int64_t layer, int64_t pos, int64_t kv_head, float* k) const {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  const uint8_t* region = page(layer, pos) + size_t(kv_head) * l.head_bytes();
  kv::decode_key(l, region, int(pos % kv::kBlockTokens), k);
}

void KVCache::load_value(int64_t layer, int64_t pos, int64_t kv_head, float* v) const {
  const kv::CodecLayout& l = layouts_[size_t(layer)];
  const uint8_t* region = page(layer, pos) + size_t(kv_head) * l.head_bytes();
  kv::decode_value(l, region + l.key_bytes, int(pos % kv::kBlockTokens), v);
}

}  // namespace tierlm::engine
