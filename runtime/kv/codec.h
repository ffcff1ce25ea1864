// runtime/kv/codec.h — the KV-cache codecs and the byte layout of one page (a block of kBlockTokens positions of one
// layer). Owns: codec names/parsing, the per-head page layout every encoder and attention kernel agrees on, and the
// process default codec. Never: allocate or touch page memory (that is PagePool / KVCache).
//
// A page holds, for each kv head in turn, a key region then a value region.
// Keys are stored transposed in panels of kPanel positions, so attention kernels put 16 positions in the 16 lanes
// of a vector and need no horizontal sums:
//   f32/f16/q8: element (panel p, dim j, lane l) at index (p*d + j)*16 + l; q8 adds f16 scales [p][block][16].
//   turbo:      u16 bit-planes [p][d][words], words = bits (+1 for the QJL sign plane); bit l of plane w is bit w
//               of the code of lane l; then f16 norms [p][16] and, with QJL, f16 residual norms [p][16].
// Values are stored position-major (the weighted sum walks positions):
//   f32/f16/q8: row t at t*d; q8 adds f16 scales [t][block].
//   turbo:      u16 bit-planes [t][d/16][bits] (bit i of a plane is dim 16*c + i), then f16 norms [t].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tierlm::kv {

enum class Codec : uint8_t { f32, f16, q8, turbo3, turbo4 };
inline constexpr int kCodecCount = 5;

const char* codec_name(Codec c);
// Accepts f32, f16, q8, turbo3, turbo4; throws std::invalid_argument listing them otherwise.
Codec parse_codec(std::string_view name);
// The revision of a codec's numerics: raised whenever what it stores changes (turbo3: 2 since its keys became 4-bit
// MSE without QJL), so a quality figure measured on an older revision (calibrate's kv_quality) is not trusted.
int codec_revision(Codec c);

inline constexpr int kBlockTokens = 32;  // positions per page
inline constexpr int kPanel = 16;        // key positions per transposed panel (one AVX-512 vector of lanes)
inline constexpr int kPanels = kBlockTokens / kPanel;

// Turbo variants beyond the two named codecs exist for quality studies (e.g. 3-bit keys + a QJL sign plane, turbo3
// until 2026-11; turbo3 is now {4, no QJL, 3}, turbo4 {4, no QJL, 4}); a TurboSpec describes any of them.
struct TurboSpec {
  int key_bits = 3;   // Lloyd-Max bits per key dimension (1..4)
  bool key_qjl = true;
  int value_bits = 3; // Lloyd-Max bits per value dimension (1..4)
};

struct CodecLayout {
  Codec codec = Codec::f32;
  int head_dim = 0;
  int q8_block = 0;     // q8: dims per scale
  TurboSpec turbo;      // turbo codecs only
  int key_words = 0;    // turbo: u16 planes per (panel, dim)
  // Byte offsets inside one head's key / value region of a page, and the region sizes.
  size_t key_scales = 0, key_norms = 0, key_residual_norms = 0, key_bytes = 0;
  size_t value_scales = 0, value_norms = 0, value_bytes = 0;

  bool is_turbo() const { return codec == Codec::turbo3 || codec == Codec::turbo4; }
  double key_bits_per_dim() const { return 8.0 * double(key_bytes) / (double(kBlockTokens) * head_dim); }
  double value_bits_per_dim() const { return 8.0 * double(value_bytes) / (double(kBlockTokens) * head_dim); }
  size_t head_bytes() const { return key_bytes + value_bytes; }
};

// Layout of `codec` for head_dim; turbo codecs need a power-of-two head_dim >= 16 (the Walsh-Hadamard rotation),
// q8 a head_dim divisible by its block. Throws std::invalid_argument naming the problem.
CodecLayout layout_for(Codec codec, int head_dim);
// A turbo layout with explicit bit widths (codec turbo3 or turbo4 is only the label it carries).
CodecLayout turbo_layout(const TurboSpec& spec, int head_dim, Codec label = Codec::turbo3);

// The codec a KVCache uses when none is given (f32 unless set: exact, so reference tests hold). The CLI and the
// plan set it; it is process-wide on purpose, so every cache an engine creates agrees.
Codec default_codec();
void set_default_codec(Codec c);

}  // namespace tierlm::kv
