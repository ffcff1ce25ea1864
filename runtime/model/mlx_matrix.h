// runtime/model/mlx_matrix.h — mlx-community quantized modules (QuantizationConfig in runtime/model/config.h) as
// kernel weights. A module `base` is quantized when config.json has "quantization" and the folder holds
// base.scales; base.weight (uint32 words), base.scales and, in affine mode, base.biases then become one weight:
// mlx_q4 / mlx_q8 (affine) or mxfp4 (the words' bytes are gpt-oss's blocks, the uint8 scales its E8M0 exponents),
// several modules fused row-wise (q/k/v, gate/up), rows optionally reordered (MLA's rope rows); or the module's
// values in f32, as mx.dequantize gives them.
// Owns: the MLX tensors' shape and dtype checks and the per-module bits / group size / mode lookup.
// Never: quantize or round values; keep pointers into the safetensors mapping; allocate outside the ledger.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/weights.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "tiering/ledger.h"

namespace tierlm::model {

bool is_mlx_module(const TensorIndex& index, const ModelConfig& config, const std::string& base);
// A module read as a plain float tensor whose .weight is MLX-packed (U32/I32) lacks its .scales: a ModelError naming
// both, instead of a confusing shape mismatch.
void refuse_packed_without_scales(const TensorInfo& weight, const std::string& base);

struct MlxPart {
  std::string base;  // module path, without ".weight"
  int64_t rows = 0;
};

// The rows of `parts` ([rows_i x cols] each) concatenated into one weight charged to `account`; output row i is
// source row row_source(i) of the concatenation (no function: in order). Throws ModelError naming the tensor of a
// wrong shape or dtype, or two parts quantized differently.
kernels::Weight mlx_matrix(const TensorIndex& index, const ModelConfig& config, const std::vector<MlxPart>& parts,
                           int64_t cols, tiering::Ledger& ledger, const std::string& account,
                           const std::function<int64_t(int64_t)>& row_source = {});

// A quantized module's values in f32, row-major over its logical `shape` ([..., rows, cols]: a Linear, or the
// [heads, out, in] of mlx-lm's MultiLinear), dequantized exactly (scale * q + bias, or the E2M1 value times 2^e).
std::vector<float> mlx_dequantize(const TensorIndex& index, const ModelConfig& config, const std::string& base,
                                  const std::vector<int64_t>& shape, tiering::Ledger& ledger);

}  // namespace tierlm::model
