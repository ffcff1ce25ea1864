// runtime/engine/ops.h — the small elementwise pieces of a transformer block (RMSNorm, RoPE, SiLU and GeLU-tanh
// gates, soft-capping, softmax) as plain functions over spans. Matrix work lives in runtime/kernels.
// Never: allocate or log here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/config.h"

namespace tierlm::engine {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]   (out may alias x)
void rms_norm(const float* x, const float* weight, int64_t n, double eps, float* out);
// out[i] = x[i] / sqrt(mean(x^2) + eps)   (a norm without weights: Gemma 4's v_norm and router norm)
void rms_norm_unscaled(const float* x, int64_t n, double eps, float* out);

// Rotary embedding in the Hugging Face "rotate_half" layout: pairs (j, j + rotary/2) over the first rotary =
// head_dim * partial_rotary_factor dims of each head; the rest pass through unchanged. YaRN (gpt-oss) blends
// interpolated and original frequencies and scales cos/sin by its attention factor.
class Rope {
 public:
  Rope(const model::RopeConfig& config, int64_t head_dim);
  // Rotates `heads` consecutive vectors of head_dim at position pos in place.
  void apply(float* x, int64_t heads, int64_t pos) const;
  const std::vector<float>& inverse_frequencies() const { return inv_freq_; }

 private:
  int64_t head_dim_;
  float scale_;  // cos and sin are multiplied by it (YaRN's attention factor), else 1
  int64_t rotary_dim_;
  std::vector<float> inv_freq_;
};

// gate_up holds [gate(n) | up(n)]; out[i] = silu(gate[i]) * up[i].
void silu_gate(const float* gate_up, int64_t n, float* out);

// gelu with torch's tanh approximation (gelu_pytorch_tanh); gelu_tanh_gate: out[i] = gelu(gate[i]) * up[i] (GeGLU).
float gelu_tanh(float x);
void gelu_tanh_gate(const float* gate_up, int64_t n, float* out);
// gpt-oss's experts (GptOssExperts): gate_up interleaved (gate[i] = gate_up[2i], up[i] = gate_up[2i + 1]);
// gate clamped above at 7, up to [-7, 7]; out[i] = (up + 1) * gate * sigmoid(1.702 * gate).
void clamped_swiglu_interleaved(const float* gate_up, int64_t n, float* out);
// The gate of a gated MLP as the model's activation names it.
using GateFn = void (*)(const float* gate_up, int64_t n, float* out);
inline GateFn gate_for(const std::string& hidden_act) {
  return hidden_act == "gelu_pytorch_tanh" ? gelu_tanh_gate : silu_gate;
}

// Logit soft-capping (Gemma): x = cap * tanh(x / cap), in place.
void soft_cap(float* x, int64_t n, double cap);

// In-place softmax over x[0..n).
void softmax(float* x, int64_t n);

}  // namespace tierlm::engine
