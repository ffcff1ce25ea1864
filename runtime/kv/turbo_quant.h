// runtime/kv/turbo_quant.h — the fixed, data-oblivious pieces of TurboQuant (Zandieh et al., arXiv 2504.19874) for
// one head_dim: Lloyd-Max centroids of N(0,1) (coordinates of a randomly rotated unit vector, times sqrt(d)), the
// random rotation (random signs, then a normalized fast Walsh-Hadamard transform) and the Gaussian QJL matrix S.
// Owns: those tables, built once per head_dim and shared read-only. Never: touch the cache or allocate per call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tierlm::kv {

class TurboTables {
 public:
  static const TurboTables& get(int head_dim);  // thread-safe, built on first use

  int head_dim() const { return d_; }
  // Lloyd-Max reconstruction levels for N(0,1) with 2^bits levels, ascending; padded with zeros to 16.
  const std::array<float, 16>& centroids(int bits) const { return centroids_[size_t(bits)]; }
  // Nearest level of z for `bits` (levels are scalar, so thresholds at midpoints are exact).
  int quantize(float z, int bits) const;

  // y = R x with R = H D / sqrt(d) (D: random signs, H: Walsh-Hadamard); orthogonal, so <Rx, Ry> = <x, y>.
  void rotate(const float* x, float* y) const;
  // x = R^T y.
  void unrotate(const float* y, float* x) const;
  // y = S x, S: d x d i.i.d. N(0,1), the QJL projection.
  void project(const float* x, float* y) const;
  // x = S^T y (the QJL dequantization direction).
  void project_transposed(const float* y, float* x) const;

 private:
  explicit TurboTables(int head_dim);
  int d_;
  std::array<std::array<float, 16>, 5> centroids_{};
  std::array<std::array<float, 15>, 5> thresholds_{};
  std::vector<float> signs_;
  std::vector<float> qjl_;  // row-major d x d
};

// In-place unnormalized Walsh-Hadamard transform of x[n], n a power of two.
void walsh_hadamard(float* x, int n);

}  // namespace tierlm::kv
