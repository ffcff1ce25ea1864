#include "runtime/engine/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "runtime/engine/row_ops.h"

namespace tierlm::engine {

namespace {

// q_a_layernorm and kv_a_layernorm are built with the RMSNorm's default eps, not the config's rms_norm_eps.
constexpr double kLoraNormEps = 1e-6;

int64_t first_rows(const model::ModelConfig& c) {
  return c.mla.q_lora_rank > 0 ? c.mla.q_lora_rank : c.num_heads * c.mla.qk_head_dim();
}

}  // namespace

MlaAttention::MlaAttention(const model::ModelWeights& w, kernels::ThreadPool& pool, tiering::Ledger& ledger,
                           int64_t max_rows)
    : w_(w), pool_(pool), max_rows_(max_rows), rope_(w.config.rope, w.config.mla.qk_rope_head_dim) {
  const auto& c = w.config;
  const model::MlaConfig& m = c.mla;
  projected_ = scratch_floats(ledger, max_rows * (first_rows(c) + m.latent_floats()));
  if (m.q_lora_rank > 0) q_a_ = scratch_floats(ledger, max_rows * m.q_lora_rank);
  q_ = scratch_floats(ledger, max_rows * c.num_heads * m.qk_head_dim());
  heads_out_ = scratch_floats(ledger, max_rows * c.num_heads * m.v_head_dim);
  work_ = scratch_floats(ledger, int64_t(pool.size()) * 2 * m.kv_lora_rank);  // per thread: q_latent, latent mix
}

void MlaAttention::run(int64_t layer, const float* x, int64_t n, std::span<KVCache* const> caches,
                       std::span<const int64_t> positions, float* out) {
  if (n > max_rows_) throw std::invalid_argument("mla: more rows than the mixer was sized for");
  const auto& c = w_.config;
  const model::MlaConfig& m = c.mla;
  const model::LayerWeights& L = w_.layers[size_t(layer)];
  const int64_t heads = c.num_heads, qk = m.qk_head_dim(), nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
  const int64_t lora = m.kv_lora_rank, v = m.v_head_dim, latent = m.latent_floats();
  const int64_t first = first_rows(c), stride = first + latent;
  float* projected = projected_.as<float>();
  float* q = q_.as<float>();
  multiply(L.mla_in.view, x, n, projected, pool_);

  // Each row's latent and roped key into its cache; its query (through q LoRA) with the rope dims turned.
  for (int64_t i = 0; i < n; ++i) {
    const float* row = projected + i * stride;
    float* cached = caches[size_t(i)]->latent_row(layer, positions[size_t(i)]);
    rms_norm(row + first, L.kv_a_norm.data(), lora, kLoraNormEps, cached);
    std::memcpy(cached + lora, row + first + lora, size_t(rope) * sizeof(float));
    rope_.apply(cached + lora, 1, positions[size_t(i)]);
    if (m.q_lora_rank > 0)
      rms_norm(row, L.q_a_norm.data(), m.q_lora_rank, kLoraNormEps, q_a_.as<float>() + i * m.q_lora_rank);
    else
      std::memcpy(q + i * heads * qk, row, size_t(heads * qk) * sizeof(float));
  }
  if (m.q_lora_rank > 0) multiply(L.q_b.view, q_a_.as<float>(), n, q, pool_);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h) rope_.apply(q + (i * heads + h) * qk + nope, 1, positions[size_t(i)]);

  const float* key = L.kv_b_key.as<float>();
  const float* value = L.kv_b_value.as<float>();
  const float scale = float(m.softmax_scale);
  float* heads_out = heads_out_.as<float>();
  pool_.parallel_for(n * heads, [&](int64_t begin, int64_t end, int thread) {
    float* q_latent = work_.as<float>() + int64_t(thread) * 2 * lora;
    float* mix = q_latent + lora;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / heads, h = item % heads;
      const float* q_nope = q + (i * heads + h) * qk;
      const float* q_rope = q_nope + nope;
      const float* k = key + h * lora * nope;
      for (int64_t r = 0; r < lora; ++r) q_latent[r] = dot(k + r * nope, q_nope, nope);
      // Online softmax over positions [0, pos]: running max, running sum, latent mix rescaled as the max grows.
      const float* rows = caches[size_t(i)]->latent_rows(layer);
      const int64_t len = positions[size_t(i)] + 1;
      float best = -INFINITY, sum = 0;
      std::memset(mix, 0, size_t(lora) * sizeof(float));
      for (int64_t t = 0; t < len; ++t) {
        const float* cached = rows + t * latent;
        const float s = (dot(q_latent, cached, lora) + dot(q_rope, cached + lora, rope)) * scale;
        if (s > best) {
          const float shrink = std::exp(best - s);  // 0 on the first position (best = -inf)
          sum *= shrink;
          for (int64_t r = 0; r < lora; ++r) mix[r] *= shrink;
          best = s;
        }
        const float p = std::exp(s - best);
        sum += p;
        for (int64_t r = 0; r < lora; ++r) mix[r] += p * cached[r];
      }
      const float inv = 1.0f / sum;
      float* o = heads_out + (i * heads + h) * v;
      const float* uv = value + h * v * lora;
      for (int64_t d = 0; d < v; ++d) o[d] = dot(uv + d * lora, mix, lora) * inv;
    }
  });
  multiply(L.o.view, heads_out, n, out, pool_);
}

}  // namespace tierlm::engine
