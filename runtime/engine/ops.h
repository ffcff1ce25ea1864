// runtime/engine/ops.h — the small elementwise pieces of a transformer block (RMSNorm, RoPE, SiLU-gate, softmax)
// as plain functions over spans. Matrix work lives in runtime/kernels. Never: allocate or log here.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/config.h"

namespace tierlm::engine {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]   (out may alias x)
void rms_norm(const float* x, const float* weight, int64_t n, double eps, float* out);

// Rotary embedding in the Hugging Face "rotate_half" layout: pairs (j, j + rotary/2) over the first rotary =
// head_dim * partial_rotary_factor dims of each head; the rest pass through unchanged.
class Rope {
 public:
  Rope(const model::RopeConfig& config, int64_t head_dim);
  // Rotates `heads` consecutive vectors of head_dim at position pos in place.
  void apply(float* x, int64_t heads, int64_t pos) const;
  const std::vector<float>& inverse_frequencies() const { return inv_freq_; }

 private:
  int64_t head_dim_;
  int64_t rotary_dim_;
  std::vector<float> inv_freq_;
};

// gate_up holds [gate(n) | up(n)]; out[i] = silu(gate[i]) * up[i].
void silu_gate(const float* gate_up, int64_t n, float* out);

// In-place softmax over x[0..n).
void softmax(float* x, int64_t n);

}  // namespace tierlm::engine
