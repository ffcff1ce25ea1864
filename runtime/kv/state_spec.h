// runtime/kv/state_spec.h — what one layer's per-sequence state costs: the one place that says how many pages an
// attention layer holds for a context (all of it for full attention; a ring bounded to the window plus one prefill
// chunk for sliding-window attention) and so how many bytes, and what a recurrent layer (Gated DeltaNet: conv state
// + recurrent state) holds whatever the context, and what an MLA layer's latent rows cost (kv_lora_rank + rope dims
// per position, f32, no heads: an order of magnitude below the heads' keys and values). The KV cache sizes its pools
// from it; the planner, /health and the GPU backend ask it instead of multiplying layers by positions themselves.
// Never: allocate, or know about sequences (that is KVCache).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/kv/codec.h"

namespace tierlm::kv {

struct StateSpec {
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t window = 0;  // 0: full attention; else the positions a query sees, itself included
  uint64_t recurrent_bytes = 0;  // > 0: a recurrent layer: this fixed state and no pages (kv_heads, window unused)
  int64_t latent_floats = 0;     // > 0: an MLA layer: this many f32 per position (latent + roped key), no pages

  bool latent() const { return latent_floats > 0; }
  uint64_t latent_bytes_per_position() const { return uint64_t(latent_floats) * sizeof(float); }

  bool windowed() const { return window > 0; }
  bool recurrent() const { return recurrent_bytes > 0; }
  // Pages of kBlockTokens positions held for a sequence of up to `context` positions run in chunks of at most
  // `chunk` tokens. A windowed layer needs positions [p - window + 1, p + chunk) at once while a chunk starting at p
  // runs; that span touches at most ceil((window - 1 + chunk) / kBlockTokens) + 1 pages.
  int64_t pages(int64_t context, int64_t chunk) const;
  // Bytes of one page (every kv head), rounded to a cache line as the pools lay them out.
  size_t page_bytes(const CodecLayout& layout) const;
  uint64_t bytes(const CodecLayout& layout, int64_t context, int64_t chunk) const {
    if (recurrent()) return recurrent_bytes;
    if (latent()) return latent_bytes_per_position() * uint64_t(context);
    return uint64_t(page_bytes(layout)) * uint64_t(pages(context, chunk));
  }
  // Growth per position once the context is long: full attention pays every position (an MLA layer its latent
  // row), windowed and recurrent layers nothing.
  double bytes_per_token(const CodecLayout& layout) const {
    if (latent()) return double(latent_bytes_per_position());
    return windowed() || recurrent() ? 0.0 : double(page_bytes(layout)) / kBlockTokens;
  }
  // What a layer holds whatever the context: a windowed layer's ring, a recurrent layer's state; 0 for full attention.
  uint64_t fixed_bytes(const CodecLayout& layout, int64_t chunk) const {
    if (recurrent()) return recurrent_bytes;
    return windowed() ? uint64_t(page_bytes(layout)) * uint64_t(ring_pages(chunk)) : 0;
  }
  int64_t ring_pages(int64_t chunk) const;
};

}  // namespace tierlm::kv
