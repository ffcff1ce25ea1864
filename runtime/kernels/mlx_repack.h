// runtime/kernels/mlx_repack.h — MLX affine tensors (mlx-community layout) rewritten into the packed panel layout of
// kernel_isa.h, in place into memory the caller owns: the weight's own storage at load, or an expert cache slot at
// a miss, straight from the read's staging bytes.
// Owns: the mapping from MLX's row-major uint32 words (code j of a word at bits j*bits, little-endian) and its
// [rows, cols/group] scales and biases to panels, quads and per-panel scale lanes.
// Never: allocate, or touch memory outside the rows it is told to write (a slot's other matrix shares the block).
#pragma once

#include <cstdint>

#include "runtime/kernels/weights.h"

namespace tierlm::kernels {

// Where rows go: the packed data, scales and biases of a [total_rows x cols] mlx_q4 / mlx_q8 weight (sizes as
// weight_bytes counts them), written from row first_row (a multiple of the 16-row panel height).
struct MlxPackTarget {
  void* data = nullptr;
  void* scales = nullptr;
  void* biases = nullptr;
  int64_t total_rows = 0;
  int64_t first_row = 0;
};

// Writes `rows` rows of an MLX tensor (words: uint32 [rows, cols*bits/32]; scales, biases: [rows, cols/group_size]
// of scale_type; any alignment) at target.first_row. Rows past total_rows in the last panel (padding) get code 0
// and scale 0 when this call writes that panel. bits 4 or 8; throws std::invalid_argument on a shape it cannot hold.
void pack_mlx_rows(const void* words, const void* scales, const void* biases, SourceType scale_type, int64_t rows,
                   int64_t cols, int group_size, int bits, const MlxPackTarget& target);

}  // namespace tierlm::kernels
