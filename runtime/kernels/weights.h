// runtime/kernels/weights.h — weight formats and the matrix kernels the forward pass calls.
// Owns: the in-memory layout of every weight format (f32, f16, bf16, q8_0, q4 group-wise, MLX affine 4/8-bit, MXFP4),
// conversion/quantization at load time, and matvec (decode) / matmul (prefill) over those layouts.
// Never: allocate outside the ledger for weights, log, or allocate in matvec/matmul hot paths.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "runtime/kernels/matmul_scratch.h"
#include "runtime/kernels/thread_pool.h"
#include "tiering/ledger.h"

namespace tierlm::kernels {

enum class WeightFormat : uint8_t { f32, f16, bf16, q8_0, q4, mlx_q4, mlx_q8, mxfp4 };

const char* format_name(WeightFormat f);
// Accepts "f32", "f16", "bf16", "q8_0" (or "q8"), "q4"; throws std::invalid_argument with the accepted list otherwise.
WeightFormat parse_format(std::string_view name);
// The format whose format_name is `name` (every format, MLX and MXFP4 included: the names profiles and plans
// record); nullopt for any other name.
std::optional<WeightFormat> format_from_name(std::string_view name);

// Element types a weight can be converted from (what safetensors stores for dense weights).
enum class SourceType : uint8_t { f32, f16, bf16 };

// A non-owning view of a [rows x cols] row-major weight (rows = output features, cols = input features).
struct WeightView {
  WeightFormat format = WeightFormat::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;    // packed values (layout per format; see weights.cpp)
  const void* scales = nullptr;  // per-group scales where the format keeps them apart (MLX)
  const void* biases = nullptr;  // per-group biases (MLX affine)
  SourceType scale_type = SourceType::f32;  // element type of scales/biases (MLX: f16/bf16/f32)
  int group_size = 0;            // MLX / q4 group size along cols
  int bits = 0;                  // MLX: 4 or 8
};

// An owning weight: storage charged to a ledger account.
struct Weight {
  WeightView view;
  tiering::LedgerBuffer data;
  tiering::LedgerBuffer scales;
  tiering::LedgerBuffer biases;
};

// Converts/quantizes a dense [rows x cols] source into `target` (f32, f16, bf16, q8_0 or q4).
Weight make_weight(const void* src, SourceType src_type, int64_t rows, int64_t cols, WeightFormat target,
                   tiering::Ledger& ledger, const std::string& account);

// Wraps MLX affine-quantized tensors (weight: uint32 [rows, cols*bits/32], scales/biases: [rows, cols/group_size])
// by copying them into ledger-owned storage. bits must be 4 or 8; throws std::invalid_argument otherwise.
Weight make_mlx_weight(const void* packed, const void* scales, const void* biases, SourceType scale_type,
                       int64_t rows, int64_t cols, int group_size, int bits, tiering::Ledger& ledger,
                       const std::string& account);

// Wraps MXFP4 tensors as gpt-oss stores them (blocks: uint8 [rows, cols/32, 16], scales: uint8 E8M0 [rows, cols/32];
// runtime/kernels/mxfp4.h) by copying them, unchanged, into ledger-owned storage: 4.25 bits per weight.
Weight make_mxfp4_weight(const void* blocks, const void* scales, int64_t rows, int64_t cols, tiering::Ledger& ledger,
                         const std::string& account);

// Bytes the weight occupies (data + scales + biases): what one full read of it costs.
uint64_t weight_bytes(const WeightView& w);

// y[rows] = W · x (x: cols floats). Uses the pool and the calling thread's MatmulScratch (allocates only where that
// scratch holds less than matmul_scratch_sizes says). q8_0/q4 round x to int8 per 32 columns; MLX
// weights are multiplied with x in f32 (MLX's own semantics, so an MLX folder computes its dequantized weights' math).
void matvec(const WeightView& w, const float* x, float* y, ThreadPool& pool);
// Several matvecs in one dispatch: y_t = W_t · x_t for every task, each task's panels (or dense row blocks) units
// of one parallel_for, so k small matrices cost the pool one fork/join instead of k (a decode step's experts: at 16
// threads each expert's matvec was a few microseconds of work a thread, about what its fork/join cost). Every row
// of y_t is the sum matvec computes, bit for bit. The tasks must share a format, cols and group size, one that
// matvec_batch_supported accepts (else std::invalid_argument); at most as many tasks as the MatmulScratch holds
// activation rows for (it grows otherwise, as matmul's would).
struct MatvecTask {
  const WeightView* w;
  const float* x;
  float* y;
};
bool matvec_batch_supported(WeightFormat format);
void matvec_batch(std::span<const MatvecTask> tasks, ThreadPool& pool);
// Y[n x rows] = X[n x cols] · Wᵀ, for prefill. Scratch as matvec.
void matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool);
// What matvec (n == 1) or matmul of n activation rows by a weight of this format and shape takes from the
// MatmulScratch, region by region (the dispatch's own rule: the kernels request exactly these sizes).
MatmulScratch::Sizes matmul_scratch_sizes(WeightFormat format, int64_t rows, int64_t cols, int group_size, int64_t n);
// True where matmul multiplies packed (q8_0 / q4) weights by 32 rows or more on AMX bf16 tiles (this CPU has them and
// they are not switched off: TIERLM_AMX=0); the rows then also take a bf16 copy in the scratch.
bool matmul_uses_amx();
inline MatmulScratch::Sizes matmul_scratch_sizes(const WeightView& w, int64_t n) {
  return matmul_scratch_sizes(w.format, w.rows, w.cols, w.group_size, n);
}
// Whether matmul of n rows in this format calls OpenBLAS (dense formats where the ISA has no dense GEMM kernel: f32,
// and f16/bf16 beyond a few rows): such a call must not run on several threads at once, each with a serial pool
// (OpenBLAS threads itself); every other format's matmul runs wholly on the pool it is given.
bool matmul_uses_blas(WeightFormat format, int64_t n);
// Writes row `row` of W, dequantized, into out[cols] (embedding lookup).
void dequantize_row(const WeightView& w, int64_t row, float* out);

}  // namespace tierlm::kernels
