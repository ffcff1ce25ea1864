#include "runtime/engine/gated_deltanet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "runtime/engine/ops.h"

namespace tierlm::engine {

namespace {

void multiply(const kernels::WeightView& w, const float* x, int64_t n, float* y, kernels::ThreadPool& pool) {
  if (n == 1)
    kernels::matvec(w, x, y, pool);
  else
    kernels::matmul(w, x, n, y, pool);
}

tiering::LedgerBuffer floats(tiering::Ledger& ledger, int64_t n) {
  return tiering::LedgerBuffer(ledger, tiering::accounts::scratch, size_t(std::max<int64_t>(n, 1)) * sizeof(float));
}

constexpr int64_t kMaxValueHeadDim = 1024;  // the per-head delta lives on the stack

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x * rsqrt(sum(x^2) + eps), as the FLA-aligned l2norm of the definition (eps 1e-6), then times `scale`.
void l2_normalize(float* x, int64_t n, float scale) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = scale / std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(const model::ModelWeights& w, kernels::ThreadPool& pool, tiering::Ledger& ledger,
                             int64_t max_rows)
    : w_(w), pool_(pool), max_rows_(max_rows) {
  const model::DeltaNetConfig& d = w.config.deltanet;
  if (d.conv_kernel < 1 || d.key_heads <= 0 || d.value_heads % d.key_heads != 0 ||
      d.value_head_dim > kMaxValueHeadDim)
    throw std::invalid_argument("gated deltanet: invalid linear attention sizes");
  projected_ = floats(ledger, max_rows * (d.conv_dim() + d.value_dim() + 2 * d.value_heads));
  mixed_ = floats(ledger, max_rows * d.conv_dim());
  core_ = floats(ledger, max_rows * d.value_dim());
  segment_start_.reserve(size_t(max_rows) + 1);
}

void GatedDeltaNet::run(int64_t layer, const float* x, int64_t n, std::span<KVCache* const> caches,
                        std::span<const int64_t> positions, float* out) {
  if (n > max_rows_) throw std::invalid_argument("gated deltanet: more rows than the mixer was sized for");
  const model::DeltaNetConfig& d = w_.config.deltanet;
  const model::LayerWeights& L = w_.layers[size_t(layer)];
  const int64_t C = d.conv_dim(), K = d.conv_kernel, Vd = d.value_dim(), nv = d.value_heads;
  const int64_t dk = d.key_head_dim, dv = d.value_head_dim, key_dim = d.key_dim();
  const int64_t heads_per_key = nv / d.key_heads;
  const int64_t width = C + Vd + 2 * nv;  // one projected row: [qkv (C) | z (Vd) | b (nv) | a (nv)]
  float* projected = projected_.as<float>();
  float* mixed = mixed_.as<float>();
  float* core = core_.as<float>();

  multiply(L.linear_in.view, x, n, projected, pool_);

  // Sequences of the batch: runs of consecutive rows sharing a state. A run starting at position 0 is a fresh
  // sequence (a reused slot's old state must not leak into it).
  segment_start_.clear();
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || caches[size_t(i)] != caches[size_t(i - 1)]) {
      segment_start_.push_back(i);
      if (positions[size_t(i)] == 0) {
        std::fill_n(caches[size_t(i)]->conv_state(layer), d.conv_state_floats(), 0.0f);
        std::fill_n(caches[size_t(i)]->recurrent_state(layer), d.recurrent_state_floats(), 0.0f);
      }
    }
  segment_start_.push_back(n);
  const int64_t segments = int64_t(segment_start_.size()) - 1;

  // Causal depthwise conv1d + SiLU, per channel: out_t = silu(sum_j w[j] * in[t - (K-1) + j]); the window of the
  // last K-1 inputs persists in the state.
  pool_.parallel_for(segments * C, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / C, c = item % C;
      float* window = caches[size_t(segment_start_[size_t(s)])]->conv_state(layer) + c * (K - 1);
      const float* weight = L.conv.data() + c * K;
      for (int64_t i = segment_start_[size_t(s)]; i < segment_start_[size_t(s + 1)]; ++i) {
        const float input = projected[i * width + c];
        float acc = weight[K - 1] * input;
        for (int64_t j = 0; j < K - 1; ++j) acc += weight[j] * window[j];
        if (K > 1) {
          std::memmove(window, window + 1, size_t(K - 2) * sizeof(float));
          window[K - 2] = input;
        }
        mixed[i * C + c] = silu(acc);
      }
    }
  });

  // q, k l2-normalized (q also by 1/sqrt(dk)), per row and key head.
  const float q_scale = 1.0f / std::sqrt(float(dk));
  pool_.parallel_for(n * d.key_heads, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / d.key_heads, h = item % d.key_heads;
      l2_normalize(mixed + i * C + h * dk, dk, q_scale);
      l2_normalize(mixed + i * C + key_dim + h * dk, dk, 1.0f);
    }
  });

  // The gated delta rule per (sequence, value head), token by token:
  //   S *= exp(g); delta = (v - S^T k) * beta; S += k delta^T; o = S^T q      (S: dk x dv)
  pool_.parallel_for(segments * nv, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / nv, h = item % nv, kh = h / heads_per_key;
      float* S = caches[size_t(segment_start_[size_t(s)])]->recurrent_state(layer) + h * dk * dv;
      float delta[kMaxValueHeadDim];
      for (int64_t i = segment_start_[size_t(s)]; i < segment_start_[size_t(s + 1)]; ++i) {
        const float* row = projected + i * width;
        const float* q = mixed + i * C + kh * dk;
        const float* k = mixed + i * C + key_dim + kh * dk;
        const float* v = mixed + i * C + 2 * key_dim + h * dv;
        const float beta = sigmoid(row[C + Vd + h]);
        const float g = L.decay_rate[size_t(h)] * softplus(row[C + Vd + nv + h] + L.dt_bias[size_t(h)]);
        const float decay = std::exp(g);
        for (int64_t j = 0; j < dv; ++j) delta[j] = 0;
        for (int64_t a = 0; a < dk; ++a) {
          float* Sa = S + a * dv;
          for (int64_t j = 0; j < dv; ++j) {
            Sa[j] *= decay;
            delta[j] += Sa[j] * k[a];
          }
        }
        for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - delta[j]) * beta;
        float* o = core + i * Vd + h * dv;
        for (int64_t j = 0; j < dv; ++j) o[j] = 0;
        for (int64_t a = 0; a < dk; ++a) {
          float* Sa = S + a * dv;
          for (int64_t j = 0; j < dv; ++j) {
            Sa[j] += k[a] * delta[j];
            o[j] += Sa[j] * q[a];
          }
        }
        // RMSNormGated: rms_norm(o) * w * silu(z) (the weight is plain, not zero-centred).
        const float* z = row + C + h * dv;
        rms_norm(o, L.gated_norm.data(), dv, w_.config.rms_norm_eps, o);
        for (int64_t j = 0; j < dv; ++j) o[j] *= silu(z[j]);
      }
    }
  });

  multiply(L.o.view, core, n, out, pool_);
}

}  // namespace tierlm::engine
