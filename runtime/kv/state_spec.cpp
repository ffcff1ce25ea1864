#include "runtime/kv/state_spec.h"

#include <algorithm>

namespace tierlm::kv {

namespace {
int64_t pages_for(int64_t positions) { return (positions + kBlockTokens - 1) / kBlockTokens; }
}  // namespace

int64_t StateSpec::ring_pages(int64_t chunk) const {
  return pages_for(window - 1 + std::max<int64_t>(chunk, 1)) + 1;
}

int64_t StateSpec::pages(int64_t context, int64_t chunk) const {
  if (recurrent() || latent()) return 0;
  const int64_t all = pages_for(context);
  return windowed() ? std::min(all, ring_pages(chunk)) : all;
}

size_t StateSpec::page_bytes(const CodecLayout& layout) const {
  return (layout.head_bytes() * size_t(kv_heads) + 63) & ~size_t(63);
}

}  // namespace tierlm::kv
