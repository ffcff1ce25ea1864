#include "runtime/model/model.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "runtime/model/mla_weights.h"
#include "runtime/model/mlx_matrix.h"
#include "runtime/model/moe_model.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_convert.h"
#include "runtime/model/tensor_names.h"

namespace tierlm::model {

using kernels::SourceType;
using kernels::Weight;
using kernels::WeightFormat;
using tiering::Ledger;
using tiering::LedgerBuffer;

namespace {

struct Loader {
  const TensorIndex& index;
  const ModelConfig& config;
  const LoadOptions& options;
  Ledger& ledger;
  const TensorNames& names;

  const TensorInfo& tensor(const std::string& name, std::vector<int64_t> shape) const {
    const TensorInfo& t = index.at(name);
    if (t.shape != shape)
      throw ModelError(fmt::format("tensor '{}' in {} has shape [{}], expected [{}] from config.json", name, t.file,
                                   fmt::join(t.shape, ", "), fmt::join(shape, ", ")));
    return t;
  }

  std::vector<float> vector(const std::string& name, int64_t n) const {
    return tensor_to_f32(index, tensor(name, {n}));
  }

  bool is_mlx(const std::string& base) const { return is_mlx_module(index, config, base); }

  // One matrix made of the row-wise concatenation of `parts` (each [rows_i, cols]).
  Weight matrix(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) const {
    int64_t rows = 0;
    for (auto& p : parts) rows += p.second;
    if (is_mlx(parts.front().first)) return mlx_matrix(parts, cols);

    WeightFormat source_format = WeightFormat::f32;
    LedgerBuffer staging(ledger, tiering::accounts::scratch, size_t(rows * cols) * sizeof(float));
    float* out = staging.as<float>();
    for (auto& [base, r] : parts) {
      refuse_packed_without_scales(index.at(base + ".weight"), base);
      const TensorInfo& t = tensor(base + ".weight", {r, cols});
      if (t.dtype == DType::BF16) source_format = WeightFormat::bf16;
      if (t.dtype == DType::F16) source_format = WeightFormat::f16;
      tensor_to_f32(index, t, out);
      out += r * cols;
    }
    const WeightFormat target = options.weight_format.value_or(source_format);
    return kernels::make_weight(staging.data(), SourceType::f32, rows, cols, target, ledger,
                                tiering::accounts::weights);
  }

  // An RMSNorm weight as the forward pass applies it (x * w): zero-centred families (x * (1 + w)) get 1 added,
  // unless the folder is mlx-lm's, whose sanitize already did.
  std::vector<float> norm(const std::string& name, int64_t n) const {
    std::vector<float> w = vector(name, n);
    if (config.arch.zero_centred_norms && !names.mlx_tree)
      for (float& x : w) x += 1.0f;
    return w;
  }

  // One row vector of a [1, cols] matrix, dequantized when the file quantized it (mlx-lm's shared_expert_gate).
  std::vector<float> row_vector(const std::string& base, int64_t cols) const {
    if (!is_mlx(base)) return tensor_to_f32(index, tensor(base + ".weight", {1, cols}));
    const Weight w = matrix({{base, 1}}, cols);
    std::vector<float> out(static_cast<size_t>(cols));
    kernels::dequantize_row(w.view, 0, out.data());
    return out;
  }

  Weight mlx_matrix(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) const {
    std::vector<MlxPart> mlx;
    for (auto& [base, rows] : parts) mlx.push_back({base, rows});
    return model::mlx_matrix(index, config, mlx, cols, ledger, tiering::accounts::weights);
  }
};

// A Gated DeltaNet layer (prefix "...linear_attn."): the four input projections fused row-wise, the depthwise conv
// ([C, 1, K] as transformers stores it, or mlx-lm's [C, K, 1]: the same order in memory), -exp(A_log), dt_bias, the
// gated norm and out_proj.
void load_deltanet(const Loader& L, const std::string& p, LayerWeights& l) {
  const DeltaNetConfig& d = L.config.deltanet;
  const int64_t H = L.config.hidden_size, C = d.conv_dim(), K = d.conv_kernel, nv = d.value_heads;
  l.linear_in = L.matrix({{p + "in_proj_qkv", C}, {p + "in_proj_z", d.value_dim()}, {p + "in_proj_b", nv},
                          {p + "in_proj_a", nv}}, H);
  const TensorInfo& conv = L.index.at(p + "conv1d.weight");
  if (conv.shape != std::vector<int64_t>{C, 1, K} && conv.shape != std::vector<int64_t>{C, K, 1})
    throw ModelError(fmt::format("tensor '{}' in {} has shape [{}], expected [{}, 1, {}] (or mlx's [{}, {}, 1]) from "
                                 "config.json", conv.name, conv.file, fmt::join(conv.shape, ", "), C, K, C, K));
  l.conv = tensor_to_f32(L.index, conv);
  l.decay_rate = L.vector(p + "A_log", nv);
  for (float& a : l.decay_rate) a = -std::exp(a);
  l.dt_bias = L.vector(p + "dt_bias", nv);
  l.gated_norm = L.vector(p + "norm.weight", d.value_head_dim);
  l.o = L.matrix({{p + "out_proj", H}}, d.value_dim());
}

}  // namespace

uint64_t ModelWeights::bytes() const {
  uint64_t total = kernels::weight_bytes(embed.view) + (lm_head.view.rows ? kernels::weight_bytes(lm_head.view) : 0);
  auto bytes = [](const kernels::Weight& w) { return w.view.rows ? kernels::weight_bytes(w.view) : 0; };
  for (auto& l : layers)
    total += bytes(l.qkv) + bytes(l.linear_in) + bytes(l.o) + bytes(l.gate_up) + bytes(l.down) + bytes(l.router) +
             bytes(l.shared_gate_up) + bytes(l.shared_down) + bytes(l.per_layer_input_gate) +
             bytes(l.per_layer_projection) + bytes(l.mla_in) + bytes(l.q_b) + l.kv_b_key.size() +
             l.kv_b_value.size();
  return total + bytes(embed_per_layer) + bytes(per_layer_model_projection);
}

namespace {

// Gemma 4's tensors beyond the common ones (runtime/model/config.h ArchitectureSpec::gemma4).
void load_gemma4_layer(const Loader& L, const std::string& p, const LayerSpec& spec, LayerWeights& l) {
  const ModelConfig& c = L.config;
  const int64_t H = c.hidden_size;
  l.pre_feedforward_norm = L.vector(p + "pre_feedforward_layernorm.weight", H);
  l.post_feedforward_norm = L.vector(p + "post_feedforward_layernorm.weight", H);
  l.layer_scalar = L.vector(p + "layer_scalar", 1)[0];
  if (spec.mlp == Mlp::moe) {
    l.router = L.matrix({{p + "router.proj", c.num_experts}}, H);
    l.router_scale = L.vector(p + "router.scale", H);
    l.per_expert_scale = L.vector(p + "router.per_expert_scale", c.num_experts);
    l.post_feedforward_norm_1 = L.vector(p + "post_feedforward_layernorm_1.weight", H);
    l.pre_feedforward_norm_2 = L.vector(p + "pre_feedforward_layernorm_2.weight", H);
    l.post_feedforward_norm_2 = L.vector(p + "post_feedforward_layernorm_2.weight", H);
  }
  if (const int64_t P = c.per_layer_input_size; P > 0) {
    l.per_layer_input_gate = L.matrix({{p + "per_layer_input_gate", P}}, H);
    l.per_layer_projection = L.matrix({{p + "per_layer_projection", H}}, P);
    l.post_per_layer_input_norm = L.vector(p + "post_per_layer_input_norm.weight", H);
  }
}

}  // namespace

ModelWeights load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  ModelWeights m;
  m.config = load_config(dir);
  const ModelConfig& c = m.config;
  TensorIndex index = TensorIndex::open(dir);
  Ledger& ledger = options.ledger ? *options.ledger : Ledger::global();
  const TensorNames names = find_tensor_names(index);
  log_skipped_tensors(index);
  Loader L{index, c, options, ledger, names};

  const int64_t H = c.hidden_size;
  const size_t total = size_t(c.num_layers) + 2;
  size_t done = 0;
  auto tick = [&] {
    ++done;
    if (options.progress) options.progress(done, total);
  };

  m.embed = L.matrix({{names.model + "embed_tokens", c.vocab_size}}, H);
  m.final_norm = L.norm(names.model + "norm.weight", H);
  if (const int64_t P = c.per_layer_input_size; P > 0) {
    m.embed_per_layer =
        L.matrix({{names.model + "embed_tokens_per_layer", c.per_layer_vocab_size}}, c.num_layers * P);
    m.per_layer_model_projection = L.matrix({{names.model + "per_layer_model_projection", c.num_layers * P}}, H);
    m.per_layer_projection_norm = L.vector(names.model + "per_layer_projection_norm.weight", P);
  }
  tick();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = names.layer(i);
    const LayerSpec spec = c.layer(i);
    const int64_t hd = spec.head_dim, q_rows = c.num_heads * hd, kv_rows = spec.kv_heads * hd;
    const bool own_kv = spec.kv_source < 0;
    LayerWeights l;
    if (spec.mixer == Mixer::gated_deltanet) {
      load_deltanet(L, p + "linear_attn.", l);
    } else if (spec.mixer == Mixer::mla) {
      load_mla_layer(index, c, p + "self_attn.", options.weight_format, ledger, l);
    } else {
      // With an output gate, q_proj holds [query | gate] per head: twice the query rows (split by the forward pass).
      // KV-shared layers (gemma4) have no k/v projections; k_eq_v layers no v_proj.
      const int64_t q_proj_rows = c.arch.attention_output_gate ? 2 * q_rows : q_rows;
      std::vector<std::pair<std::string, int64_t>> qkv = {{p + "self_attn.q_proj", q_proj_rows}};
      if (own_kv) qkv.push_back({p + "self_attn.k_proj", kv_rows});
      if (own_kv && !spec.k_eq_v) qkv.push_back({p + "self_attn.v_proj", kv_rows});
      l.qkv = L.matrix(qkv, H);
      if (c.arch.qkv_bias) {
        for (auto [name, n] : {std::pair{"q_proj", q_rows}, {"k_proj", kv_rows}, {"v_proj", kv_rows}}) {
          auto b = L.vector(p + "self_attn." + name + ".bias", n);
          l.qkv_bias.insert(l.qkv_bias.end(), b.begin(), b.end());
        }
      }
      if (c.arch.qk_norm) {
        // One head's width (qwen3), or the whole projection (olmoe): the forward pass normalizes in units of it.
        l.q_norm = L.norm(p + "self_attn.q_norm.weight", c.arch.qk_norm_full_width ? q_rows : hd);
        if (own_kv) l.k_norm = L.norm(p + "self_attn.k_norm.weight", c.arch.qk_norm_full_width ? kv_rows : hd);
      }
      l.o = L.matrix({{p + "self_attn.o_proj", H}}, q_rows);
      if (c.arch.gpt_oss) l.sinks = L.vector(p + "self_attn.sinks", c.num_heads);
      if (c.o_bias) l.o_bias = L.vector(p + "self_attn.o_proj.bias", H);
    }
    l.input_norm = L.norm(p + "input_layernorm.weight", H);
    l.post_attention_norm = L.norm(p + "post_attention_layernorm.weight", H);
    if (c.arch.gemma4) load_gemma4_layer(L, p, spec, l);
    if (spec.mlp == Mlp::moe && !c.arch.gemma4) {
      const std::string b = p + c.arch.moe_block + ".";
      l.router = L.matrix({{b + c.arch.router, c.num_experts}}, H);
      if (c.arch.gpt_oss) l.router_bias = L.vector(b + c.arch.router + ".bias", c.num_experts);
      if (c.arch.shared_expert) {
        const int64_t S = c.shared_expert_intermediate_size;
        l.shared_gate_up = L.matrix({{b + "shared_expert.gate_proj", S}, {b + "shared_expert.up_proj", S}}, H);
        l.shared_down = L.matrix({{b + "shared_expert.down_proj", H}}, S);
        l.shared_expert_gate = L.row_vector(b + "shared_expert_gate", H);
      }
      if (c.arch.mla && c.shared_expert_intermediate_size > 0) {  // DeepSeek: ungated shared experts
        const int64_t S = c.shared_expert_intermediate_size;
        l.shared_gate_up = L.matrix({{b + "shared_experts.gate_proj", S}, {b + "shared_experts.up_proj", S}}, H);
        l.shared_down = L.matrix({{b + "shared_experts.down_proj", H}}, S);
      }
      if (c.router.score_correction_bias)
        l.score_correction_bias = L.vector(b + "gate.e_score_correction_bias", c.num_experts);
    } else {
      // Dense layers, and Gemma 4's dense MLP that runs beside its experts.
      const int64_t I = spec.intermediate;
      l.gate_up = L.matrix({{p + "mlp.gate_proj", I}, {p + "mlp.up_proj", I}}, H);
      l.down = L.matrix({{p + "mlp.down_proj", H}}, I);
      if (c.mlp_bias) {
        l.gate_up_bias = L.vector(p + "mlp.gate_proj.bias", I);
        auto up = L.vector(p + "mlp.up_proj.bias", I);
        l.gate_up_bias.insert(l.gate_up_bias.end(), up.begin(), up.end());
        l.down_bias = L.vector(p + "mlp.down_proj.bias", H);
      }
    }
    m.layers.push_back(std::move(l));
    tick();
  }
  const bool has_head = index.contains(names.lm_head + ".weight") || index.contains(names.lm_head + ".scales");
  if (!c.tie_word_embeddings || has_head) {
    if (!has_head)
      throw ModelError(fmt::format("{}: config.json says tie_word_embeddings=false but there is no {}.weight",
                                   dir.string(), names.lm_head));
    m.lm_head = L.matrix({{names.lm_head, c.vocab_size}}, H);
  }
  if (c.arch.moe) m.experts = open_expert_tier(dir, index, c, options, ledger);
  tick();
  return m;
}

}  // namespace tierlm::model
