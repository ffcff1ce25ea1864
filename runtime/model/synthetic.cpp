#include "runtime/model/synthetic.h"

#include <cmath>
#include <random>

namespace tierlm::model {

ModelConfig llama_1b_config() {
  ModelConfig c;
  c.model_type = "llama";
  c.arch = *find_architecture("llama");
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_layers = 16;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope.theta = 500000.0;
  c.tie_word_embeddings = true;
  return c;
}

namespace {

kernels::Weight random_matrix(int64_t rows, int64_t cols, kernels::WeightFormat format, tiering::Ledger& ledger,
                              std::mt19937_64& rng) {
  // Staged in f32 (charged to scratch, released after conversion), then converted to the target format.
  tiering::LedgerBuffer staging(ledger, tiering::accounts::scratch, size_t(rows * cols) * sizeof(float));
  float* out = staging.as<float>();
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(cols)));
  // A cheap generator: one normal per 64 values, perturbed, keeps set-up time small for ~1.2 G weights.
  for (int64_t i = 0; i < rows * cols; i += 64) {
    const float base = normal(rng);
    const uint64_t bits = rng();
    for (int64_t j = 0; j < 64 && i + j < rows * cols; ++j)
      out[i + j] = base * (((bits >> j) & 1) ? 1.0f : -0.5f) + 0.01f * float(j % 7);
  }
  return kernels::make_weight(out, kernels::SourceType::f32, rows, cols, format, ledger, tiering::accounts::weights);
}

}  // namespace

ModelWeights synthetic_model(const ModelConfig& c, kernels::WeightFormat format, tiering::Ledger& ledger,
                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  ModelWeights m;
  m.config = c;
  const int64_t H = c.hidden_size, q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
  m.embed = random_matrix(c.vocab_size, H, format, ledger, rng);
  m.final_norm.assign(size_t(H), 1.0f);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights l;
    l.qkv = random_matrix(q_rows + 2 * kv_rows, H, format, ledger, rng);
    if (c.arch.qkv_bias) l.qkv_bias.assign(size_t(q_rows + 2 * kv_rows), 0.0f);
    if (c.arch.qk_norm) {
      l.q_norm.assign(size_t(c.head_dim), 1.0f);
      l.k_norm.assign(size_t(c.head_dim), 1.0f);
    }
    l.o = random_matrix(H, q_rows, format, ledger, rng);
    l.input_norm.assign(size_t(H), 1.0f);
    l.post_attention_norm.assign(size_t(H), 1.0f);
    l.gate_up = random_matrix(2 * c.intermediate_size, H, format, ledger, rng);
    l.down = random_matrix(H, c.intermediate_size, format, ledger, rng);
    m.layers.push_back(std::move(l));
  }
  if (!c.tie_word_embeddings) m.lm_head = random_matrix(c.vocab_size, H, format, ledger, rng);
  return m;
}

}  // namespace tierlm::model
