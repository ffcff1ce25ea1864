// runtime/kernels/affine_f32.h — internal: float-activation kernels for affine-quantized packed weights (MLX 4/8-bit).
// Owns: the contract of y = sum_g d[g] * (sum_{c in g} u[c] * x[c]) + m[g] * (sum_{c in g} x[c]) over the packed panel
//       layout of kernel_isa.h, with x and every accumulation in f32 — what MLX's own quantized matmul computes
//       (its qmv/qmm take float activations and add bias * sum(x) per group), so an MLX folder's logits are those of
//       its dequantized weights in f32, not of int8-rounded activations.
// Never: quantize activations, touch symmetric (q8_0) weights, allocate, or be called from outside runtime/kernels.
#pragma once

#include <cstdint>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

// Y[i*ldy + row] for activation rows i in [0, n) (x row-major, stride w.cols) and panels [p0, p1) of an affine packed
// weight (w.m non-null). gsum[i*w.groups() + g] = sum of row i's x over group g (see group_sums).
using AffineF32Kernel = void (*)(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y,
                                 int64_t ldy, int64_t p0, int64_t p1);

void affine_f32_scalar(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                       int64_t p0, int64_t p1);
void affine_f32_avx2(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                     int64_t p0, int64_t p1);
void affine_f32_avx512(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                       int64_t p0, int64_t p1);

// The kernel of the active ISA (active_isa()).
AffineF32Kernel affine_f32_kernel();

// gsum[g] = sum of x[g*group .. (g+1)*group) in f32, for one activation row.
void group_sums(const float* x, int64_t cols, int group, float* gsum);

// How matvec/matmul multiply MLX (mlx_q4 / mlx_q8) weights: with f32 activations (the default, MLX's semantics) or
// with the activations quantized to int8 per 32 columns like q8_0/q4 (kept for the benches that measure what
// exactness costs). Process-wide, like set_isa_for_testing. f32 is the only mode the engine offers: an MLX folder's
// numbers mean float activations (int8 ones moved tiny fixtures' logits by up to 1.3 relative), and the cost
// measured by bench/kernels_bench (BM_MlxDecodeStep, Llama-3.2-1B shapes, one thread of a loaded 2-core Zen 4) is
// about 20% of decode tok/s at 4 bits, none at 8 bits (memory-bound), and 1.5-3x on prefill GEMMs (no VNNI).
enum class MlxActivations : uint8_t { f32, int8 };
MlxActivations mlx_activations();
void set_mlx_activations_for_testing(MlxActivations mode);

}  // namespace tierlm::kernels
