#include "runtime/model/mla_weights.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "runtime/model/mlx_matrix.h"
#include "runtime/model/tensor_convert.h"

namespace tierlm::model {

namespace {

using kernels::SourceType;
using kernels::WeightFormat;

// Reads the layer's tensors, each a plain f32/f16/bf16 (or FP8) `.weight` or an MLX-quantized module
// (runtime/model/mlx_matrix.h).
struct MlaReader {
  const TensorIndex& index;
  const ModelConfig& config;
  const std::optional<WeightFormat> format;
  tiering::Ledger& ledger;

  bool mlx(const std::string& base) const { return is_mlx_module(index, config, base); }

  // A module's values in f32 over its logical shape ([rows, cols], or MultiLinear's [heads, out, in]).
  std::vector<float> values(const std::string& base, const std::vector<int64_t>& shape) const {
    if (mlx(base)) return mlx_dequantize(index, config, base, shape, ledger);
    const TensorInfo& t = index.at(base + ".weight");
    refuse_packed_without_scales(t, base);
    if (t.shape != shape)
      throw ModelError(fmt::format("tensor '{}' in {} has shape [{}], expected [{}] from config.json", t.name, t.file,
                                   fmt::join(t.shape, ", "), fmt::join(shape, ", ")));
    return tensor_to_f32(index, t);
  }

  // One weight from `parts` ([rows_i x cols] each, concatenated) whose row i is source row order[i]. Every part MLX
  // with one quantization: kept in it (rows reordered as stored). Otherwise read into f32 and converted to `format`,
  // else the file's precision (f32 when a part was MLX: its dequantized values are not all bf16-exact).
  kernels::Weight matrix(const std::vector<MlxPart>& parts, int64_t cols, const std::vector<int64_t>& order) const {
    bool all_mlx = true, any_mlx = false;
    for (const MlxPart& part : parts) {
      const bool m = mlx(part.base);
      all_mlx = all_mlx && m;
      any_mlx = any_mlx || m;
      if (m && all_mlx) {
        const auto a = config.quantization->of(part.base), b = config.quantization->of(parts.front().base);
        all_mlx = a.bits == b.bits && a.group_size == b.group_size && a.mxfp4 == b.mxfp4;
      }
    }
    if (all_mlx)
      return mlx_matrix(index, config, parts, cols, ledger, tiering::accounts::weights,
                        [&](int64_t r) { return order[size_t(r)]; });
    // Each part's rows go straight to where `order` puts them: one f32 copy of the matrix, plus one part at a time.
    WeightFormat file_format = WeightFormat::f32;
    std::vector<float> ordered(order.size() * size_t(cols));
    int64_t first = 0;
    for (const MlxPart& part : parts) {
      if (!mlx(part.base)) {
        const DType d = index.at(part.base + ".weight").dtype;
        if (!any_mlx && d == DType::BF16) file_format = WeightFormat::bf16;
        if (!any_mlx && d == DType::F16) file_format = WeightFormat::f16;
      }
      const std::vector<float> v = values(part.base, {part.rows, cols});
      for (size_t r = 0; r < order.size(); ++r)
        if (order[r] >= first && order[r] < first + part.rows)
          std::memcpy(ordered.data() + r * size_t(cols), v.data() + size_t(order[r] - first) * size_t(cols),
                      size_t(cols) * sizeof(float));
      first += part.rows;
    }
    return kernels::make_weight(ordered.data(), SourceType::f32, int64_t(order.size()), cols,
                                format.value_or(file_format), ledger, tiering::accounts::weights);
  }
};

// Rows [first, first + n) in order, appended to `order`.
void in_order(std::vector<int64_t>& order, int64_t first, int64_t n) {
  for (int64_t i = 0; i < n; ++i) order.push_back(first + i);
}

// Rows [first, first + rope) de-interleaved (see rope_source), appended to `order`.
void deinterleaved(std::vector<int64_t>& order, int64_t first, int64_t rope) {
  for (int64_t i = 0; i < rope; ++i) order.push_back(first + rope_source(i, rope));
}

}  // namespace

void load_mla_layer(const TensorIndex& index, const ModelConfig& c, const std::string& p,
                    std::optional<WeightFormat> format, tiering::Ledger& ledger, LayerWeights& l) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, heads = c.num_heads, qk = m.qk_head_dim(), nope = m.qk_nope_head_dim;
  const int64_t rope = m.qk_rope_head_dim, lora = m.kv_lora_rank, v = m.v_head_dim;
  const MlaReader r{index, c, format, ledger};

  // The query projection's rows [heads x (nope | rope)], each head's rope rows de-interleaved.
  std::vector<int64_t> q_order;
  for (int64_t h = 0; h < heads; ++h) {
    in_order(q_order, h * qk, nope);
    deinterleaved(q_order, h * qk + nope, rope);
  }
  // mla_in: [q_a | kv_a] (or [q | kv_a]); kv_a's rope rows (after the latent) de-interleaved.
  const int64_t first_rows = m.q_lora_rank > 0 ? m.q_lora_rank : heads * qk;
  std::vector<int64_t> in_rows;
  if (m.q_lora_rank > 0)
    in_order(in_rows, 0, first_rows);
  else
    in_rows = q_order;
  in_order(in_rows, first_rows, lora);
  deinterleaved(in_rows, first_rows + lora, rope);
  const MlxPart kv_a{p + "kv_a_proj_with_mqa", lora + rope};
  if (m.q_lora_rank > 0) {
    l.mla_in = r.matrix({{p + "q_a_proj", m.q_lora_rank}, kv_a}, H, in_rows);
    l.q_b = r.matrix({{p + "q_b_proj", heads * qk}}, m.q_lora_rank, q_order);
    l.q_a_norm = tensor_to_f32(index, index.at(p + "q_a_layernorm.weight"));
    if (int64_t(l.q_a_norm.size()) != m.q_lora_rank)
      throw ModelError(fmt::format("tensor '{}q_a_layernorm.weight' must hold q_lora_rank = {} floats", p,
                                   m.q_lora_rank));
  } else {
    l.mla_in = r.matrix({{p + "q_proj", heads * qk}, kv_a}, H, in_rows);
  }
  l.kv_a_norm = tensor_to_f32(index, index.at(p + "kv_a_layernorm.weight"));
  if (int64_t(l.kv_a_norm.size()) != lora)
    throw ModelError(fmt::format("tensor '{}kv_a_layernorm.weight' must hold kv_lora_rank = {} floats", p, lora));

  // The absorbed kv_b halves: mlx-lm's deepseek_v3 stores them already split per head (MultiLinear embed_q
  // [heads, lora, nope] = the K half transposed, unembed_out [heads, v, lora] = the V half): exactly kv_b_key's and
  // kv_b_value's layouts. Otherwise kv_b_proj, per head rows [k_nope (nope) | v (v)] over the latent.
  l.kv_b_key = tiering::LedgerBuffer(ledger, tiering::accounts::weights, size_t(heads * lora * nope) * sizeof(float));
  l.kv_b_value = tiering::LedgerBuffer(ledger, tiering::accounts::weights, size_t(heads * v * lora) * sizeof(float));
  float* key = l.kv_b_key.as<float>();
  float* value = l.kv_b_value.as<float>();
  if (index.contains(p + "embed_q.weight") || index.contains(p + "unembed_out.weight")) {
    const std::vector<float> k = r.values(p + "embed_q", {heads, lora, nope});
    const std::vector<float> u = r.values(p + "unembed_out", {heads, v, lora});
    std::memcpy(key, k.data(), k.size() * sizeof(float));
    std::memcpy(value, u.data(), u.size() * sizeof(float));
  } else {
    const std::vector<float> kv_b = r.values(p + "kv_b_proj", {heads * (nope + v), lora});
    for (int64_t h = 0; h < heads; ++h) {
      const float* block = kv_b.data() + h * (nope + v) * lora;
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t c2 = 0; c2 < lora; ++c2) key[(h * lora + c2) * nope + d] = block[d * lora + c2];
      std::memcpy(value + h * v * lora, block + nope * lora, size_t(v * lora) * sizeof(float));
    }
  }
  std::vector<int64_t> o_rows;
  in_order(o_rows, 0, H);
  l.o = r.matrix({{p + "o_proj", H}}, heads * v, o_rows);
}

}  // namespace tierlm::model
