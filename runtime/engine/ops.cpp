#include "runtime/engine/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tierlm::engine {

void rms_norm(const float* x, const float* weight, int64_t n, double eps, float* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(sum / double(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

void rms_norm_unscaled(const float* x, int64_t n, double eps, float* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(sum / double(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
}

// Proportional RoPE (Gemma 4) keeps rotate_half over the whole head and zeroes the frequencies of the pairs past
// partial_rotary_factor; the other types rotate only the first head_dim * partial_rotary_factor dims.
namespace {

// YaRN (transformers' _compute_yarn_parameters): pair j blends the interpolated (freq / factor) and the original
// frequency by a linear ramp over the correction range of beta_fast..beta_slow rotations in the original context.
float yarn_frequency(const model::RopeConfig& c, int64_t j, int64_t dim) {
  auto correction_dim = [&](double rotations) {
    return double(dim) * std::log(double(c.original_max_position_embeddings) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(c.theta));
  };
  double low = correction_dim(c.beta_fast), high = correction_dim(c.beta_slow);
  if (c.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  const float ramp = std::clamp((float(j) - float(low)) / float(high - low), 0.0f, 1.0f);
  const float extrapolation = 1.0f - ramp;
  const float base = std::pow(float(c.theta), float(2 * j) / float(dim));  // float32, as transformers
  const float interpolated = 1.0f / (float(c.factor) * base), original = 1.0f / base;
  return interpolated * (1.0f - extrapolation) + original * extrapolation;
}

}  // namespace

Rope::Rope(const model::RopeConfig& c, int64_t head_dim)
    : head_dim_(head_dim), scale_(c.type == "yarn" ? float(c.attention_factor) : 1.0f),
      rotary_dim_(c.type == "proportional" ? head_dim : int64_t(double(head_dim) * c.partial_rotary_factor)),
      inv_freq_(size_t(rotary_dim_ / 2)) {
  const int64_t half = rotary_dim_ / 2;
  for (int64_t j = 0; j < half; ++j) {
    // transformers computes base ** (2j/d) in float32 (d: the rotary dims); doing the same keeps the angles close.
    const float exponent = float(2 * j) / float(rotary_dim_);
    float freq = 1.0f / std::pow(float(c.theta), exponent);
    if (c.type == "linear") {
      freq = float(freq / c.factor);
    } else if (c.type == "llama3") {
      const double old_len = double(c.original_max_position_embeddings);
      const double low_wavelen = old_len / c.low_freq_factor;
      const double high_wavelen = old_len / c.high_freq_factor;
      const double wl = 2.0 * std::numbers::pi / double(freq);
      if (wl > low_wavelen) {
        freq = float(freq / c.factor);
      } else if (wl >= high_wavelen) {
        const double smooth = (old_len / wl - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
        freq = float((1.0 - smooth) * freq / c.factor + smooth * freq);
      }
    }
    if (c.type == "yarn") freq = yarn_frequency(c, j, rotary_dim_);
    if (c.type == "proportional") {
      // Gemma 4's full layers: the first int(partial * head_dim / 2) pairs rotate, the others keep angle 0.
      const int64_t rotated = int64_t(c.partial_rotary_factor * double(head_dim) / 2.0);
      freq = j < rotated ? float(freq / c.factor) : 0.0f;
    }
    inv_freq_[j] = freq;
  }
}

void Rope::apply(float* x, int64_t heads, int64_t pos) const {
  const int64_t half = rotary_dim_ / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float angle = float(pos) * inv_freq_[j];
    const float c = std::cos(angle) * scale_, s = std::sin(angle) * scale_;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_dim_;
      const float a = v[j], b = v[j + half];
      v[j] = a * c - b * s;
      v[j + half] = b * c + a * s;
    }
  }
}

void silu_gate(const float* gate_up, int64_t n, float* out) {
  const float* gate = gate_up;
  const float* up = gate_up + n;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void clamped_swiglu_interleaved(const float* gate_up, int64_t n, float* out) {
  constexpr float kLimit = 7.0f, kAlpha = 1.702f;  // hard-coded in GptOssExperts
  for (int64_t i = 0; i < n; ++i) {
    const float gate = std::min(gate_up[2 * i], kLimit);
    const float up = std::clamp(gate_up[2 * i + 1], -kLimit, kLimit);
    out[i] = (up + 1.0f) * (gate * (1.0f / (1.0f + std::exp(-gate * kAlpha))));
  }
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi), as torch's tanh approximation
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

void gelu_tanh_gate(const float* gate_up, int64_t n, float* out) {
  const float* gate = gate_up;
  const float* up = gate_up + n;
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

void soft_cap(float* x, int64_t n, double cap) {
  const float c = float(cap);
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / c) * c;
}

void softmax(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace tierlm::engine
