// runtime/kv/block_codec.h — writes one position of one kv head into a page region in its codec's layout, and
// reads it back (the reference decoders tests and quality studies use; attention never decodes whole positions).
// Owns: quantization of single key/value vectors. Never: allocate; writes of different positions of the same page
// may run concurrently (bit-planes shared by 16 positions are updated atomically).
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/kv/codec.h"

namespace tierlm::kv {

inline uint16_t to_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float from_half(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

// slot: position within the page, 0 <= slot < kBlockTokens. Regions are one head's key / value region.
void encode_key(const CodecLayout& layout, uint8_t* key_region, int slot, const float* k);
void encode_value(const CodecLayout& layout, uint8_t* value_region, int slot, const float* v);
// The vectors the codec stands for (for turbo keys: the MSE part plus the QJL estimate of the residual,
// R^T(c/sqrt(d) + ||r|| sqrt(pi/2)/d S^T sign(S r)) scaled by the norm — unbiased for inner products).
void decode_key(const CodecLayout& layout, const uint8_t* key_region, int slot, float* k);
void decode_value(const CodecLayout& layout, const uint8_t* value_region, int slot, float* v);

}  // namespace tierlm::kv
