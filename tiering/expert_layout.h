// tiering/expert_layout.h — the in-memory (and packed on-disk) layout of one expert: its fused gate_up matrix
// [2I x H] and its down matrix [H x I] in one kernel weight format, as six 64-byte aligned parts in one block whose
// size is a multiple of 4 KiB, so a slot can be filled by one O_DIRECT read of a packed file.
// Owns: the byte offsets of each part and turning a block's address into the two WeightViews the forward pass uses.
// Never: allocate, or know where the bytes come from.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/weights.h"

namespace tierlm::tiering {

inline constexpr uint64_t kIoAlignment = 4096;
inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }

struct ExpertViews {
  kernels::WeightView gate_up;  // rows: [gate (I) | up (I)], cols H (gpt-oss: gate and up rows interleaved)
  kernels::WeightView down;     // rows H, cols I
  const float* gate_up_bias = nullptr;  // 2I floats added to gate_up's output (gpt-oss), else null
  const float* down_bias = nullptr;     // H floats added to down's output, else null
};

struct ExpertLayout {
  struct Part {
    uint64_t offset = 0, bytes = 0;
  };
  kernels::WeightFormat format = kernels::WeightFormat::f32;
  int64_t hidden = 0, intermediate = 0;
  int group_size = 0, bits = 0;
  kernels::SourceType scale_type = kernels::SourceType::f32;
  // [0..2]: gate_up data, scales, biases; [3..5]: down data, scales, biases; [6], [7]: the experts' own output
  // biases in f32 (gate_up 2I, down H) when row_biases (gpt-oss). Absent parts have 0 bytes.
  Part parts[8];
  bool row_biases = false;
  uint64_t bytes = 0;  // the block size, a multiple of kIoAlignment

  // A layout for a format: dense (f32/f16/bf16), q8_0 / q4 (group 32, f16 scales), or MLX (group/bits/scale type
  // from the file). Throws std::invalid_argument on shapes the format cannot hold.
  static ExpertLayout make(kernels::WeightFormat format, int64_t hidden, int64_t intermediate, int group_size = 0,
                           int bits = 0, kernels::SourceType scale_type = kernels::SourceType::f16,
                           bool row_biases = false);
  // Bytes of weight data proper (without the alignment padding): what a matvec touches.
  uint64_t payload_bytes() const;
  ExpertViews views(const void* block) const;
  // Copies an owning weight (as made by kernels::make_weight / make_mlx_weight) into the parts of `block`.
  void store(const kernels::Weight& gate_up, const kernels::Weight& down, void* block) const;
  // Copies the output biases (2I and H floats) into parts 6 and 7 (row_biases layouts only).
  void store_row_biases(const float* gate_up_bias, const float* down_bias, void* block) const;
};

}  // namespace tierlm::tiering
