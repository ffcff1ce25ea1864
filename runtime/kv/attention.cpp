#include "runtime/kv/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/kv/block_codec.h"
#include "runtime/kv/turbo_quant.h"

namespace tierlm::kv {

namespace {

constexpr int kMaxDim = 1024;

template <class T> const T* at(const uint8_t* base, size_t offset) {
  return reinterpret_cast<const T*>(base + offset);
}

// ---- Scalar reference kernels: the layout of codec.h, read one element at a time. ----------------------------

void score_scalar(const CodecLayout& L, const uint8_t* keys, int tokens, const QueryGroup& q, float* scores) {
  const int d = L.head_dim;
  const auto& centroids = L.is_turbo() ? TurboTables::get(d).centroids(L.turbo.key_bits) : std::array<float, 16>{};
  for (int h = 0; h < q.heads; ++h) {
    const float* a = q.a + size_t(h) * d;
    for (int t = 0; t < tokens; ++t) {
      const int p = t / kPanel, lane = t % kPanel;
      const size_t base = size_t(p) * d * kPanel + lane;
      float s = 0;
      switch (L.codec) {
        case Codec::f32:
          for (int j = 0; j < d; ++j) s += a[j] * at<float>(keys, 0)[base + size_t(j) * kPanel];
          break;
        case Codec::f16:
          for (int j = 0; j < d; ++j) s += a[j] * from_half(at<uint16_t>(keys, 0)[base + size_t(j) * kPanel]);
          break;
        case Codec::q8: {
          const int nb = d / L.q8_block;
          for (int b = 0; b < nb; ++b) {
            float part = 0;
            for (int j = b * L.q8_block; j < (b + 1) * L.q8_block; ++j)
              part += a[j] * float(at<int8_t>(keys, 0)[base + size_t(j) * kPanel]);
            s += part * from_half(at<uint16_t>(keys, L.key_scales)[(size_t(p) * nb + b) * kPanel + lane]);
          }
          break;
        }
        case Codec::turbo3:
        case Codec::turbo4: {
          const int W = L.key_words, bits = L.turbo.key_bits;
          const uint16_t* planes = at<uint16_t>(keys, 0) + size_t(p) * d * W;
          float mse = 0, qjl = 0;
          for (int j = 0; j < d; ++j) {
            int code = 0;
            for (int w = 0; w < bits; ++w) code |= ((planes[size_t(j) * W + w] >> lane) & 1) << w;
            mse += a[j] * centroids[size_t(code)];
            if (L.turbo.key_qjl && ((planes[size_t(j) * W + bits] >> lane) & 1)) qjl += q.b[size_t(h) * d + j];
          }
          s = mse;
          if (L.turbo.key_qjl)
            s += from_half(at<uint16_t>(keys, L.key_residual_norms)[t]) * (2.0f * qjl - q.b_sum[h]);
          s *= from_half(at<uint16_t>(keys, L.key_norms)[t]);
          break;
        }
      }
      scores[h * kBlockTokens + t] = s;
    }
  }
}

void accumulate_scalar(const CodecLayout& L, const uint8_t* values, int tokens, const float* weights, int heads,
                       float* acc) {
  const int d = L.head_dim;
  float row[kMaxDim];
  for (int t = 0; t < tokens; ++t) {
    switch (L.codec) {
      case Codec::f32:
      case Codec::f16:
      case Codec::q8: decode_value(L, values, t, row); break;
      case Codec::turbo3:
      case Codec::turbo4: {
        const int bits = L.turbo.value_bits;
        const auto& c = TurboTables::get(d).centroids(bits);
        const uint16_t* planes = at<uint16_t>(values, 0) + size_t(t) * (d / 16) * bits;
        const float norm = from_half(at<uint16_t>(values, L.value_norms)[t]);
        for (int j = 0; j < d; ++j) {
          int code = 0;
          for (int w = 0; w < bits; ++w) code |= ((planes[(j / 16) * bits + w] >> (j % 16)) & 1) << w;
          row[j] = norm * c[size_t(code)];
        }
        break;
      }
    }
    for (int h = 0; h < heads; ++h) {
      const float w = weights[h * kBlockTokens + t];
      for (int j = 0; j < d; ++j) acc[size_t(h) * d + j] += w * row[j];
    }
  }
}

float exp_sum_scalar(float* x, int n, float max) {
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += (x[i] = softmax_exp(x[i] - max));
  return sum;
}

std::atomic<bool> g_force_scalar{false};

}  // namespace

const AttentionKernels& scalar_attention_kernels() {
  static const AttentionKernels k{score_scalar, accumulate_scalar, exp_sum_scalar};
  return k;
}

bool avx512_attention_available() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("f16c");
  return ok;
}

const AttentionKernels& active_attention_kernels() {
  if (!g_force_scalar.load(std::memory_order_relaxed) && avx512_attention_available())
    return avx512_attention_kernels();
  return scalar_attention_kernels();
}

void force_scalar_attention(bool scalar) { g_force_scalar.store(scalar); }

void attend(const CodecLayout& L, const uint8_t* const* pages, int64_t ring, size_t head_offset, int64_t start,
            int64_t len, const float* q, int heads, float* out, const float* sinks) {
  const AttentionKernels& K = active_attention_kernels();
  const int d = L.head_dim;
  const float scale = 1.0f / std::sqrt(float(d));
  const bool turbo = L.is_turbo(), qjl = turbo && L.turbo.key_qjl;
  const TurboTables* T = turbo ? &TurboTables::get(d) : nullptr;
  alignas(64) float a[kMaxGroup * kMaxDim], b[kMaxGroup * kMaxDim], acc[kMaxGroup * kMaxDim];
  alignas(64) float scores[kMaxGroup * kBlockTokens], tmp[kMaxDim];
  float b_sum[kMaxGroup], m[kMaxGroup], l[kMaxGroup];
  for (int h0 = 0; h0 < heads; h0 += kMaxGroup) {
    const int H = std::min(kMaxGroup, heads - h0);
    for (int h = 0; h < H; ++h) {
      const float* qh = q + size_t(h0 + h) * d;
      float* ah = a + size_t(h) * d;
      if (!turbo) {
        for (int j = 0; j < d; ++j) ah[j] = qh[j] * scale;
      } else {
        T->rotate(qh, tmp);
        for (int j = 0; j < d; ++j) ah[j] = tmp[j] * scale * scale;  // scale * 1/sqrt(d): centroids are N(0,1)
        if (qjl) {
          float* bh = b + size_t(h) * d;
          T->project(tmp, bh);
          const float gain = scale * std::sqrt(float(M_PI) / 2.0f) / float(d);
          float s = 0;
          for (int j = 0; j < d; ++j) s += (bh[j] *= gain);
          b_sum[h] = s;
        }
      }
      m[h] = -std::numeric_limits<float>::infinity();
      l[h] = 0;
    }
    std::fill(acc, acc + size_t(H) * d, 0.0f);
    const QueryGroup group{H, a, qjl ? b : nullptr, qjl ? b_sum : nullptr};
    for (int64_t p = start / kBlockTokens; p * kBlockTokens < len; ++p) {
      const int tokens = int(std::min<int64_t>(kBlockTokens, len - p * kBlockTokens));
      // Slots before the window's first position (first page only) take no part: weight 0 below.
      const int skip = p == start / kBlockTokens ? int(start % kBlockTokens) : 0;
      const uint8_t* keys = pages[p % ring] + head_offset;
      K.score(L, keys, tokens, group, scores);
      for (int h = 0; h < H; ++h) {
        float* s = scores + h * kBlockTokens;
        const float block_max = *std::max_element(s + skip, s + tokens);
        if (block_max > m[h]) {
          const float correction = softmax_exp(m[h] - block_max);  // 0 for the first block (m = -inf)
          if (l[h] > 0) {
            float* acch = acc + size_t(h) * d;
            for (int j = 0; j < d; ++j) acch[j] *= correction;
          }
          l[h] *= correction;
          m[h] = block_max;
        }
        l[h] += K.exp_sum(s + skip, tokens - skip, m[h]);
        std::fill(s, s + skip, 0.0f);
      }
      K.accumulate(L, keys + L.key_bytes, tokens, scores, H, acc);
    }
    for (int h = 0; h < H; ++h) {
      float* oh = out + size_t(h0 + h) * d;
      const float* acch = acc + size_t(h) * d;
      float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
      if (sinks) {
        // The sink's logit joins the denominator only: p_t = exp(s_t) / (sum exp(s) + exp(sink)), scaled from
        // whichever of the two maxima is larger so neither exponential can overflow.
        const float sink = sinks[h0 + h];
        inv = sink <= m[h] ? 1.0f / (l[h] + std::exp(sink - m[h]))
                           : std::exp(m[h] - sink) / (l[h] * std::exp(m[h] - sink) + 1.0f);
      }
      if (!turbo) {
        for (int j = 0; j < d; ++j) oh[j] = acch[j] * inv;
      } else {
        for (int j = 0; j < d; ++j) tmp[j] = acch[j] * inv * scale;
        T->unrotate(tmp, oh);
      }
    }
  }
}

}  // namespace tierlm::kv
