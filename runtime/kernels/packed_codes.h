// runtime/kernels/packed_codes.h — internal: element addressing in the packed panel layout (see kernel_isa.h).
// Used by packing, dequantize_row and the scalar oracle; the SIMD kernels walk the layout directly.
#pragma once

#include <cstdint>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

// Byte offset (within the panel) and nibble of element (r, col) of a panel.
struct CodeAddress {
  int64_t byte;
  bool high_nibble;
};

inline CodeAddress code_address(int bits, int r, int64_t col) {
  if (bits == 8) return {(col / 4) * 64 + r * 4 + col % 4, false};
  const int64_t block = col / 32;
  const int quad = static_cast<int>((col % 32) / 4);
  return {block * 256 + (quad % 4) * 64 + r * 4 + col % 4, quad >= 4};
}

inline uint32_t packed_code(const PackedView& w, int64_t p, int r, int64_t col) {
  const CodeAddress a = code_address(w.bits, r, col);
  const uint8_t byte = w.data[p * w.panel_bytes() + a.byte];
  if (w.bits == 8) return byte;
  return a.high_nibble ? byte >> 4 : byte & 0x0Fu;
}

inline void put_packed_code(uint8_t* data, int64_t panel_bytes, int bits, int64_t p, int r, int64_t col,
                            uint32_t code) {
  const CodeAddress a = code_address(bits, r, col);
  uint8_t& byte = data[p * panel_bytes + a.byte];
  if (bits == 8) {
    byte = static_cast<uint8_t>(code);
  } else if (a.high_nibble) {
    byte = static_cast<uint8_t>((byte & 0x0Fu) | (code << 4));
  } else {
    byte = static_cast<uint8_t>((byte & 0xF0u) | (code & 0x0Fu));
  }
}

}  // namespace tierlm::kernels
