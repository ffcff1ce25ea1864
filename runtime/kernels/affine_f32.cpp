// runtime/kernels/affine_f32.cpp — the portable reference of the float-activation affine kernels (the oracle the
// AVX2/AVX-512 versions are tested against), the per-group activation sums, and the choice of kernel by ISA.
#include "runtime/kernels/affine_f32.h"

#include <atomic>

#include "runtime/kernels/packed_codes.h"

namespace tierlm::kernels {

namespace {
std::atomic<int> g_mlx_activations{static_cast<int>(MlxActivations::f32)};
}

MlxActivations mlx_activations() { return static_cast<MlxActivations>(g_mlx_activations.load(std::memory_order_relaxed)); }

void set_mlx_activations_for_testing(MlxActivations mode) {
  g_mlx_activations.store(static_cast<int>(mode), std::memory_order_relaxed);
}

void group_sums(const float* x, int64_t cols, int group, float* gsum) {
  for (int64_t g = 0; g < cols / group; ++g) {
    float s = 0.0f;
    for (int64_t c = g * group; c < (g + 1) * group; ++c) s += x[c];
    gsum[g] = s;
  }
}

void affine_f32_scalar(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                       int64_t p0, int64_t p1) {
  const int64_t groups = w.groups();
  for (int64_t p = p0; p < p1; ++p) {
    for (int r = 0; r < kPanelRows; ++r) {
      const int64_t row = p * kPanelRows + r;
      if (row >= w.rows) break;
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * w.cols;
        float out = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t si = (p * groups + g) * kPanelRows + r;
          float acc = 0.0f;
          for (int64_t c = g * w.group; c < (g + 1) * w.group; ++c)
            acc += static_cast<float>(packed_code(w, p, r, c)) * xi[c];
          out += load_scale(w.d, w.scale_type, si) * acc + load_scale(w.m, w.scale_type, si) * gsum[i * groups + g];
        }
        y[i * ldy + row] = out;
      }
    }
  }
}

AffineF32Kernel affine_f32_kernel() {
  switch (active_isa()) {
    case Isa::avx512: return affine_f32_avx512;
    case Isa::avx2: return affine_f32_avx2;
    case Isa::scalar: break;
  }
  return affine_f32_scalar;
}

}  // namespace tierlm::kernels
