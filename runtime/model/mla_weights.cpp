#include "runtime/model/mla_weights.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "runtime/model/tensor_convert.h"

namespace tierlm::model {

namespace {

using kernels::SourceType;
using kernels::WeightFormat;

struct MlaReader {
  const TensorIndex& index;
  const std::optional<WeightFormat> format;
  tiering::Ledger& ledger;
  WeightFormat file_format = WeightFormat::f32;

  // The tensor as f32 [rows x cols] into out, after checking its shape.
  void read(const std::string& name, int64_t rows, int64_t cols, float* out) {
    const TensorInfo& t = index.at(name);
    if (t.shape != std::vector<int64_t>{rows, cols})
      throw ModelError(fmt::format("tensor '{}' in {} has shape [{}], expected [{}, {}] from config.json", name,
                                   t.file, fmt::join(t.shape, ", "), rows, cols));
    if (t.dtype == DType::BF16) file_format = WeightFormat::bf16;
    if (t.dtype == DType::F16) file_format = WeightFormat::f16;
    tensor_to_f32(index, t, out);
  }
  kernels::Weight weight(const std::vector<float>& rows, int64_t cols) {
    return kernels::make_weight(rows.data(), SourceType::f32, int64_t(rows.size()) / cols, cols,
                                format.value_or(file_format), ledger, tiering::accounts::weights);
  }
};

// Rows [first, first + rope) of a [.. x cols] matrix de-interleaved (see rope_source).
void deinterleave_rows(float* m, int64_t first, int64_t rope, int64_t cols) {
  std::vector<float> copy(m + first * cols, m + (first + rope) * cols);
  for (int64_t i = 0; i < rope; ++i)
    std::memcpy(m + (first + i) * cols, copy.data() + rope_source(i, rope) * cols, size_t(cols) * sizeof(float));
}

}  // namespace

void load_mla_layer(const TensorIndex& index, const ModelConfig& c, const std::string& p,
                    std::optional<WeightFormat> format, tiering::Ledger& ledger, LayerWeights& l) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, heads = c.num_heads, qk = m.qk_head_dim(), nope = m.qk_nope_head_dim;
  const int64_t rope = m.qk_rope_head_dim, lora = m.kv_lora_rank, v = m.v_head_dim;
  MlaReader r{index, format, ledger};

  // The query projection whose output is [heads x (nope | rope)]: its rope rows de-interleaved per head.
  const int64_t q_in = m.q_lora_rank > 0 ? m.q_lora_rank : H;
  std::vector<float> q(size_t(heads * qk * q_in));
  r.read(p + (m.q_lora_rank > 0 ? "q_b_proj.weight" : "q_proj.weight"), heads * qk, q_in, q.data());
  for (int64_t h = 0; h < heads; ++h) deinterleave_rows(q.data(), h * qk + nope, rope, q_in);

  // mla_in: [q_a | kv_a] (or [q | kv_a]); kv_a's rope rows (after the latent) de-interleaved.
  const int64_t first_rows = m.q_lora_rank > 0 ? m.q_lora_rank : heads * qk;
  std::vector<float> in(size_t((first_rows + lora + rope) * H));
  if (m.q_lora_rank > 0)
    r.read(p + "q_a_proj.weight", m.q_lora_rank, H, in.data());
  else
    std::memcpy(in.data(), q.data(), q.size() * sizeof(float));
  r.read(p + "kv_a_proj_with_mqa.weight", lora + rope, H, in.data() + first_rows * H);
  deinterleave_rows(in.data(), first_rows + lora, rope, H);
  l.mla_in = r.weight(in, H);
  if (m.q_lora_rank > 0) {
    l.q_b = r.weight(q, m.q_lora_rank);
    l.q_a_norm = tensor_to_f32(index, index.at(p + "q_a_layernorm.weight"));
    if (int64_t(l.q_a_norm.size()) != m.q_lora_rank)
      throw ModelError(fmt::format("tensor '{}q_a_layernorm.weight' must hold q_lora_rank = {} floats", p,
                                   m.q_lora_rank));
  }
  l.kv_a_norm = tensor_to_f32(index, index.at(p + "kv_a_layernorm.weight"));
  if (int64_t(l.kv_a_norm.size()) != lora)
    throw ModelError(fmt::format("tensor '{}kv_a_layernorm.weight' must hold kv_lora_rank = {} floats", p, lora));

  // kv_b_proj: per head rows [k_nope (nope) | v (v)] over the latent.
  std::vector<float> kv_b(size_t(heads * (nope + v) * lora));
  r.read(p + "kv_b_proj.weight", heads * (nope + v), lora, kv_b.data());
  l.kv_b_key = tiering::LedgerBuffer(ledger, tiering::accounts::weights, size_t(heads * lora * nope) * sizeof(float));
  l.kv_b_value = tiering::LedgerBuffer(ledger, tiering::accounts::weights, size_t(heads * v * lora) * sizeof(float));
  float* key = l.kv_b_key.as<float>();
  float* value = l.kv_b_value.as<float>();
  for (int64_t h = 0; h < heads; ++h) {
    const float* block = kv_b.data() + h * (nope + v) * lora;
    for (int64_t d = 0; d < nope; ++d)
      for (int64_t c2 = 0; c2 < lora; ++c2) key[(h * lora + c2) * nope + d] = block[d * lora + c2];
    std::memcpy(value + h * v * lora, block + nope * lora, size_t(v * lora) * sizeof(float));
  }

  std::vector<float> o(size_t(H * heads * v));
  r.read(p + "o_proj.weight", H, heads * v, o.data());
  l.o = r.weight(o, heads * v);
}

}  // namespace tierlm::model
