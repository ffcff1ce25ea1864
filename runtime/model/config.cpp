#include "runtime/model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>
#include <tuple>
#include <sstream>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/model/config_keys.h"
#include "runtime/model/safetensors.h"

namespace tierlm::model {

namespace json = boost::json;

namespace {

// The architecture table: everything that differs between families is a field here, not a forward pass.
const std::vector<ArchitectureSpec>& table() {
  using S = ArchitectureSpec::Sliding;
  static const std::vector<ArchitectureSpec> specs = {
      {.model_type = "llama", .reads_attention_bias = true, .reads_mlp_bias = true},
      {.model_type = "mistral", .sliding = S::every_layer, .windows_checked = true},
      {.model_type = "qwen2", .qkv_bias = true, .sliding = S::layer_types, .windows_checked = true},
      {.model_type = "qwen3", .qk_norm = true, .reads_attention_bias = true, .sliding = S::layer_types},
      // Mixture-of-experts families: experts live in the expert tier (tiering/), the rest loads like a dense model.
      {.model_type = "qwen3_moe", .qk_norm = true, .moe = true, .reads_attention_bias = true,
       .sliding = S::layer_types, .reads_sparse_step = true},
      {.model_type = "mixtral", .moe = true, .moe_renormalize = true, .moe_block = "block_sparse_moe",
       .expert_gate = "w1", .expert_up = "w3", .expert_down = "w2", .sliding = S::every_layer,
       .windows_checked = true},
      {.model_type = "olmoe", .qk_norm = true, .moe = true, .qk_norm_full_width = true, .reads_attention_bias = true},
      {.model_type = "qwen2_moe", .qkv_bias = true, .moe = true, .shared_expert = true, .reads_qkv_bias = true,
       .sliding = S::layer_types, .reads_sparse_step = true},
      // Qwen3.5 (transformers 5.17 modeling_qwen3_5*.py): Gated DeltaNet layers among gated full-attention layers;
      // the MoE router always renormalizes its top-k (Qwen3_5MoeTopKRouter), plus a sigmoid-gated shared expert.
      // "_text" is the text-only config (Qwen3_5ForCausalLM), otherwise nested under text_config.
      {.model_type = "qwen3_5", .qk_norm = true, .linear_attention = true, .zero_centred_norms = true,
       .attention_output_gate = true},
      {.model_type = "qwen3_5_text", .qk_norm = true, .linear_attention = true, .zero_centred_norms = true,
       .attention_output_gate = true},
      {.model_type = "qwen3_5_moe", .qk_norm = true, .moe = true, .moe_renormalize = true, .shared_expert = true,
       .linear_attention = true, .zero_centred_norms = true, .attention_output_gate = true},
      {.model_type = "qwen3_5_moe_text", .qk_norm = true, .moe = true, .moe_renormalize = true,
       .shared_expert = true, .linear_attention = true, .zero_centred_norms = true, .attention_output_gate = true},
      // Gemma 4 text (Gemma4ForCausalLM) and the text tower of Gemma4ForConditionalGeneration (text_config): the layer
      // plan, MoE and per-layer shapes come from parse_gemma4, which turns arch.moe on with enable_moe_block.
      {.model_type = "gemma4_text", .qk_norm = true, .moe_renormalize = true, .sliding = S::layer_types,
       .windows_checked = true, .gemma4 = true},
      {.model_type = "gemma4", .qk_norm = true, .moe_renormalize = true, .sliding = S::layer_types,
       .windows_checked = true, .gemma4 = true},
      // DeepSeek-V3 / V2 (transformers 5.17 modeling_deepseek_v3.py / _v2.py): MLA layers, dense first layers,
      // DeepSeek routing and ungated shared experts; parse_deepseek reads their keys.
      {.model_type = "deepseek_v3", .moe = true, .mla = true},
      {.model_type = "deepseek_v2", .moe = true, .mla = true},
      // gpt-oss (transformers 5.17 modeling_gpt_oss.py): sliding/full layers from layer_types, attention sinks,
      // biases on q/k/v/o (attention_bias, default true), the router mlp.router with a bias, experts with biases.
      {.model_type = "gpt_oss", .moe = true, .moe_renormalize = true, .reads_attention_bias = true,
       .sliding = S::layer_types, .windows_checked = true, .gpt_oss = true, .router = "router"},
  };
  return specs;
}

class Reader {
 public:
  Reader(const json::object& o, std::string origin) : o_(o), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw ModelError(fmt::format("{}: field '{}' {}", origin_, field, what));
  }
  const json::value* get(const std::string& key) const {
    auto it = o_.find(key);
    if (it == o_.end() || it->value().is_null()) return nullptr;
    return &it->value();
  }
  int64_t integer(const std::string& key) const {
    const json::value* v = get(key);
    if (!v) fail(key, "is missing");
    return as_int(key, *v);
  }
  int64_t integer_or(const std::string& key, int64_t fallback) const {
    const json::value* v = get(key);
    return v ? as_int(key, *v) : fallback;
  }
  double number_or(const std::string& key, double fallback) const {
    const json::value* v = get(key);
    if (!v) return fallback;
    if (v->is_double()) return v->as_double();
    if (v->is_int64()) return double(v->as_int64());
    if (v->is_uint64()) return double(v->as_uint64());
    fail(key, "must be a number");
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    const json::value* v = get(key);
    if (!v) return fallback;
    if (!v->is_bool()) fail(key, "must be true or false");
    return v->as_bool();
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    const json::value* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, "must be a string");
    return std::string(v->as_string());
  }
  int64_t as_int(const std::string& key, const json::value& v) const {
    if (v.is_int64()) return v.as_int64();
    if (v.is_uint64() && v.as_uint64() <= uint64_t(INT64_MAX)) return int64_t(v.as_uint64());
    // A whole double within int64's range (converting one outside it is undefined behaviour: 1e300 is no size).
    if (v.is_double()) {
      const double d = v.as_double();
      if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == std::floor(d)) return int64_t(d);
    }
    fail(key, "must be an integer");
  }

 private:
  const json::object& o_;
  std::string origin_;
};

// YaRN's magnitude correction (transformers' get_mscale, DeepSeek's yarn_get_mscale).
double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// YaRN's keys (transformers' _compute_yarn_parameters): beta_fast/slow, truncate, and the attention factor that
// scales cos and sin: attention_factor when given, else yarn_mscale(factor, 1) (the ratio yarn_mscale(factor, mscale)
// / yarn_mscale(factor, mscale_all_dim) when both are set and nonzero). transformers 5 takes max_position_embeddings
// / original_max_position_embeddings for a missing factor; tierlm asks for the factor instead.
void yarn_from(const Reader& r, RopeConfig& rope) {
  if (!r.get("factor")) r.fail("factor", "is missing (yarn)");
  rope.beta_fast = r.number_or("beta_fast", 32.0);
  rope.beta_slow = r.number_or("beta_slow", 1.0);
  rope.truncate = r.boolean_or("truncate", true);
  const double mscale = r.number_or("mscale", 0), mscale_all_dim = r.number_or("mscale_all_dim", 0);
  rope.attention_factor = mscale != 0 && mscale_all_dim != 0
                              ? yarn_mscale(rope.factor, mscale) / yarn_mscale(rope.factor, mscale_all_dim)
                              : yarn_mscale(rope.factor, 1.0);
  rope.attention_factor = r.number_or("attention_factor", rope.attention_factor);
  if (rope.beta_fast <= rope.beta_slow) r.fail("beta_fast", "must be larger than beta_slow");
  if (!r.get("original_max_position_embeddings")) r.fail("original_max_position_embeddings", "is missing (yarn)");
}

// One RoPE parameter object. partial_rotary_factor: the rotary share of head_dim (qwen3_5's default 0.25 comes in
// as `partial`); `proportional` (Gemma 4's full layers, when allowed) rotates that share of the pairs instead.
RopeConfig rope_from(const json::object& params, double theta, double partial, const std::string& origin,
                     bool proportional_allowed, bool yarn_allowed = false) {
  RopeConfig rope;
  Reader r(params, origin);
  rope.theta = r.number_or("rope_theta", theta);
  rope.type = r.string_or("rope_type", r.string_or("type", "default"));
  rope.factor = r.number_or("factor", 1.0);
  rope.low_freq_factor = r.number_or("low_freq_factor", 1.0);
  rope.high_freq_factor = r.number_or("high_freq_factor", 4.0);
  rope.original_max_position_embeddings = r.integer_or("original_max_position_embeddings", 8192);
  rope.partial_rotary_factor = r.number_or("partial_rotary_factor", partial);
  const bool proportional = proportional_allowed && rope.type == "proportional";
  const bool yarn = yarn_allowed && rope.type == "yarn";
  if (rope.type != "default" && rope.type != "linear" && rope.type != "llama3" && !proportional && !yarn)
    r.fail("rope_type", fmt::format("'{}' is not supported (supported: default, linear, llama3{}{})", rope.type,
                                    proportional_allowed ? ", proportional" : "", yarn_allowed ? ", yarn" : ""));
  if (yarn) yarn_from(r, rope);
  if (rope.theta <= 0) r.fail("rope_theta", "must be positive");
  // mrope_section splits the rotary dims between temporal/height/width positions; for text all three positions are
  // the token's index, so every section rotates by the same angle: plain RoPE over the rotary dims (qwen3_5).
  (void)r.get("mrope_section");
  if (rope.type != "default" && rope.factor <= 0) r.fail("factor", "must be positive");
  if (rope.partial_rotary_factor <= 0 || rope.partial_rotary_factor > 1)
    r.fail("partial_rotary_factor", "must be in (0, 1]");
  return rope;
}

// transformers >= 5 writes "rope_parameters"; older configs (and most published models) "rope_scaling".
const json::object* rope_parameters(const json::object& root) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = root.find(key);
    if (it != root.end() && it->value().is_object()) return &it->value().as_object();
  }
  return nullptr;
}

RopeConfig parse_rope(const Reader& top, const json::object& root, const std::string& origin,
                      double default_partial_rotary, bool yarn_allowed = false) {
  RopeConfig rope;
  rope.theta = top.number_or("rope_theta", 10000.0);
  rope.partial_rotary_factor = top.number_or("partial_rotary_factor", default_partial_rotary);
  const json::object* params = rope_parameters(root);
  if (!params) return rope;
  return rope_from(*params, rope.theta, rope.partial_rotary_factor, origin + " (rope parameters)", false,
                   yarn_allowed);
}

std::vector<int32_t> token_ids(const Reader& r, const json::object& o, const std::string& key) {
  std::vector<int32_t> ids;
  auto id = [&](const json::value& v) {
    const int64_t x = r.as_int(key, v);
    if (x < 0 || x > INT32_MAX) r.fail(key, fmt::format("holds {}, which is not a token id", x));
    return int32_t(x);
  };
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return ids;
  if (it->value().is_array()) {
    for (auto& v : it->value().as_array()) ids.push_back(id(v));
  } else {
    ids.push_back(id(it->value()));
  }
  return ids;
}

std::vector<int64_t> integer_list(const Reader& r, const json::object& o, const std::string& key) {
  std::vector<int64_t> out;
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return out;
  if (!it->value().is_array()) r.fail(key, "must be a list of integers");
  for (auto& v : it->value().as_array()) out.push_back(r.as_int(key, v));
  return out;
}

// layer_types, when the config lists them: per layer, whether it is sliding_attention (else full_attention).
std::optional<std::vector<bool>> sliding_layer_types(const Reader& r, const json::object& o, int64_t L) {
  auto it = o.find("layer_types");
  if (it == o.end() || it->value().is_null()) return std::nullopt;
  if (!it->value().is_array() || int64_t(it->value().as_array().size()) != L)
    r.fail("layer_types", fmt::format("must list one type per layer ({})", L));
  std::vector<bool> sliding;
  for (auto& v : it->value().as_array()) {
    const std::string type = v.is_string() ? std::string(v.as_string()) : "";
    if (type != "full_attention" && type != "sliding_attention")
      r.fail("layer_types", fmt::format("entry {} ('{}') is not supported (supported: full_attention, "
                                        "sliding_attention)", sliding.size(), type));
    sliding.push_back(type == "sliding_attention");
  }
  return sliding;
}

// The family row expanded into one LayerSpec per layer, as transformers builds the layers from the same keys.
std::vector<LayerSpec> expand_layers(const Reader& r, const json::object& o, const ModelConfig& c) {
  using S = ArchitectureSpec::Sliding;
  const int64_t L = c.num_layers;
  std::vector<LayerSpec> layers(static_cast<size_t>(L));
  const int64_t window = r.integer_or("sliding_window", 0);
  std::vector<bool> sliding(size_t(L), false);
  if (c.arch.sliding == S::every_layer) {
    // mistral / mixtral: a non-null sliding_window windows every layer (transformers picks the sliding mask then).
    if (r.get("sliding_window")) {
      if (window <= 0) r.fail("sliding_window", "must be positive or null");
      sliding.assign(size_t(L), true);
    }
  } else if (c.arch.sliding == S::layer_types) {
    if (auto types = sliding_layer_types(r, o, L)) {
      sliding = *types;
    } else if (r.boolean_or("use_sliding_window", false) && window > 0) {
      // Configs written before layer_types: layers from max_window_layers on are windowed.
      const int64_t first = r.integer_or("max_window_layers", L);
      for (int64_t i = std::max<int64_t>(first, 0); i < L; ++i) sliding[size_t(i)] = true;
    }
  }
  std::vector<bool> linear(size_t(L), false);
  if (c.arch.linear_attention) {
    // qwen3_5: layer_types names each layer; without it every full_attention_interval-th layer is full attention.
    if (auto it = o.find("layer_types"); it != o.end() && !it->value().is_null()) {
      if (!it->value().is_array() || int64_t(it->value().as_array().size()) != L)
        r.fail("layer_types", fmt::format("must list one type per layer ({})", L));
      int64_t i = 0;
      for (auto& v : it->value().as_array()) {
        const std::string type = v.is_string() ? std::string(v.as_string()) : "";
        if (type == "linear_attention")
          linear[size_t(i)] = true;
        else if (type != "full_attention")
          r.fail("layer_types", fmt::format("entry {} ('{}') is not supported (supported: linear_attention, "
                                            "full_attention)", i, type));
        ++i;
      }
    } else {
      const int64_t interval = r.integer_or("full_attention_interval", 4);
      if (interval < 1) r.fail("full_attention_interval", "must be at least 1");
      for (int64_t i = 0; i < L; ++i) linear[size_t(i)] = (i + 1) % interval != 0;
    }
  }
  const bool any_sliding = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  if (any_sliding) {
    if (window <= 0) r.fail("sliding_window", "must be positive when layers use sliding-window attention");
    if (!c.arch.windows_checked)
      r.fail("sliding_window", fmt::format("sliding-window attention on {} is not supported yet (no transformers "
                                           "fixture checks it; supported on mistral, mixtral, qwen2)", c.model_type));
  }

  std::vector<bool> sparse(size_t(L), c.arch.moe);
  if (c.arch.moe && c.arch.reads_sparse_step) {
    // transformers: layer i is sparse unless listed in mlp_only_layers, and only when (i + 1) % step == 0.
    const int64_t step = r.integer_or("decoder_sparse_step", 1);
    if (step < 1) r.fail("decoder_sparse_step", "must be at least 1");
    for (int64_t i = 0; i < L; ++i) sparse[size_t(i)] = (i + 1) % step == 0;
    for (int64_t i : integer_list(r, o, "mlp_only_layers")) {
      if (i < 0 || i >= L) r.fail("mlp_only_layers", fmt::format("layer {} is outside [0, {})", i, L));
      sparse[size_t(i)] = false;
    }
  }
  int64_t expert_layer = 0;
  for (int64_t i = 0; i < L; ++i) {
    LayerSpec& l = layers[size_t(i)];
    if (sliding[size_t(i)]) {
      l.mixer = Mixer::sliding_attention;
      l.window = window;
    }
    if (linear[size_t(i)]) l.mixer = Mixer::gated_deltanet;
    if (sparse[size_t(i)]) {
      l.mlp = Mlp::moe;
      l.expert_layer = expert_layer++;
    }
  }
  if (c.arch.moe && expert_layer == 0)
    r.fail("mlp_only_layers", "leaves no sparse layer (with decoder_sparse_step); the model would have no experts");
  return layers;
}

// Gemma 4 (transformers' Gemma4TextConfig and Gemma4TextModel): everything the family reads beyond the common keys,
// and the layer plan. Defaults are the config class's; anything a checkpoint could set that tierlm does not compute
// is refused by name.
void parse_gemma4(const Reader& r, const json::object& o, ModelConfig& c) {
  const int64_t L = c.num_layers;
  if (r.get("use_bidirectional_attention"))
    r.fail("use_bidirectional_attention", "is not supported (tierlm runs causal text generation; it must be null)");
  if (r.boolean_or("attention_bias", false)) r.fail("attention_bias", "true is not supported for gemma4");
  if (c.hidden_act != "gelu_pytorch_tanh")
    r.fail("hidden_activation", fmt::format("'{}' is not supported (supported: gelu_pytorch_tanh)", c.hidden_act));
  c.embedding_scale = std::sqrt(double(c.hidden_size));
  c.attention_scale = 1.0;  // Gemma4TextAttention.scaling: q and k are RMS-normed instead
  c.final_logit_softcapping = r.number_or("final_logit_softcapping", 0.0);
  if (c.final_logit_softcapping < 0) r.fail("final_logit_softcapping", "must be positive or null");

  // layer_types: the config's, or 5 sliding : 1 full; the last layer is always full (the config class forces it).
  std::vector<bool> full(static_cast<size_t>(L), false);
  if (auto types = sliding_layer_types(r, o, L)) {
    for (int64_t i = 0; i < L; ++i) full[size_t(i)] = !(*types)[size_t(i)];
  } else {
    for (int64_t i = 0; i < L; ++i) full[size_t(i)] = (i + 1) % 6 == 0;
  }
  full[size_t(L - 1)] = true;
  const int64_t window = r.integer_or("sliding_window", 512);
  if (window <= 0) r.fail("sliding_window", "must be positive");

  // rope_parameters: one object per layer type.
  json::object default_rope;
  default_rope["sliding_attention"] = json::object{{"rope_type", "default"}, {"rope_theta", 10000.0}};
  default_rope["full_attention"] =
      json::object{{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}};
  const json::value* rope_value = r.get("rope_parameters");
  if (rope_value && !rope_value->is_object()) r.fail("rope_parameters", "must be an object");
  const json::object& ropes = rope_value ? rope_value->as_object() : default_rope;
  auto rope_of = [&](const char* type) {
    auto it = ropes.find(type);
    if (it == ropes.end() || !it->value().is_object())
      r.fail("rope_parameters", fmt::format("has no '{}' entry, which the model's layer_types use", type));
    return rope_from(it->value().as_object(), 10000.0, 1.0, fmt::format("config (rope_parameters.{})", type), true);
  };
  if (std::find(full.begin(), full.end(), false) != full.end()) c.rope = rope_of("sliding_attention");
  c.full_attention_rope = rope_of("full_attention");

  // Per-layer attention shapes: per_layer_config as saved by transformers 5.17, else global_head_dim and (with
  // attention_k_eq_v) num_global_key_value_heads on the full-attention layers, as the config class derives it.
  const bool k_eq_v = r.boolean_or("attention_k_eq_v", false);
  std::vector<int64_t> head_dim(size_t(L), c.head_dim), kv_heads(size_t(L), c.num_kv_heads);
  if (const json::value* per_layer = r.get("per_layer_config")) {
    if (!per_layer->is_object()) r.fail("per_layer_config", "must be an object of layer index -> overrides");
    for (auto& [key, value] : per_layer->as_object()) {
      int64_t i = -1;
      try {
        size_t used = 0;
        i = std::stoll(std::string(key), &used);
        if (used != key.size()) i = -1;
      } catch (const std::exception&) {
        i = -1;
      }
      if (i < 0 || i >= L) r.fail("per_layer_config", fmt::format("key '{}' is not a layer index", std::string(key)));
      if (!value.is_object()) r.fail("per_layer_config", "entries must be objects");
      Reader e(value.as_object(), "per_layer_config." + std::string(key));
      for (auto& kv : value.as_object())
        if (kv.key() != "head_dim" && kv.key() != "num_key_value_heads")
          e.fail(std::string(kv.key()), "is not supported in per_layer_config (supported: head_dim, "
                                        "num_key_value_heads)");
      head_dim[size_t(i)] = e.integer_or("head_dim", c.head_dim);
      kv_heads[size_t(i)] = e.integer_or("num_key_value_heads", c.num_kv_heads);
    }
  } else {
    const int64_t global_head_dim = r.integer_or("global_head_dim", 512);
    const int64_t global_kv = k_eq_v ? r.integer_or("num_global_key_value_heads", 0) : 0;
    for (int64_t i = 0; i < L; ++i)
      if (full[size_t(i)]) {
        head_dim[size_t(i)] = global_head_dim;
        if (global_kv > 0) kv_heads[size_t(i)] = global_kv;
      }
  }
  for (int64_t i = 0; i < L; ++i) {
    const int64_t hd = head_dim[size_t(i)], kv = kv_heads[size_t(i)];
    if (hd <= 0 || hd % 2 != 0 || hd > 4096) r.fail("per_layer_config", fmt::format("layer {}: head_dim {}", i, hd));
    if (kv <= 0 || c.num_heads % kv != 0)
      r.fail("per_layer_config", fmt::format("layer {}: {} KV heads do not divide {} heads", i, kv, c.num_heads));
    // Each layer type has one RoPE table in transformers, built for that type's head_dim.
    for (int64_t j = 0; j < i; ++j)
      if (full[size_t(j)] == full[size_t(i)] && head_dim[size_t(j)] != hd)
        r.fail("per_layer_config", fmt::format("layers {} and {} are of one type but differ in head_dim", j, i));
  }

  // KV sharing: from layer L - num_kv_shared_layers on, a layer reuses the KV of the last earlier layer of its type.
  const int64_t shared = r.integer_or("num_kv_shared_layers", 0);
  if (shared < 0 || shared >= L) r.fail("num_kv_shared_layers", fmt::format("must be in [0, {})", L));
  const int64_t first_shared = L - shared;
  const bool double_wide = r.boolean_or("use_double_wide_mlp", false);

  c.per_layer_input_size = r.integer_or("hidden_size_per_layer_input", 256);
  c.per_layer_vocab_size = r.integer_or("vocab_size_per_layer_input", 262144);
  if (c.per_layer_input_size < 0 || c.per_layer_input_size > (int64_t(1) << 16))
    r.fail("hidden_size_per_layer_input", "is out of range");
  if (c.per_layer_input_size > 0 && (c.per_layer_vocab_size <= 0 || c.per_layer_vocab_size > (int64_t(1) << 24)))
    r.fail("vocab_size_per_layer_input", "is out of range");

  const bool moe = r.boolean_or("enable_moe_block", false);
  c.arch.moe = moe;
  if (moe) {
    c.num_experts = r.integer_or("num_experts", 0);
    c.num_experts_per_tok = r.integer_or("top_k_experts", 0);
    c.moe_intermediate_size = r.integer_or("moe_intermediate_size", 0);
    c.norm_topk_prob = true;
    if (c.num_experts <= 0 || c.num_experts > 65536) r.fail("num_experts", "is missing or out of range");
    if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
      r.fail("top_k_experts", fmt::format("must be in [1, num_experts = {}]", c.num_experts));
    if (c.moe_intermediate_size <= 0) r.fail("moe_intermediate_size", "is missing or not positive");
  }
  if (c.intermediate_size <= 0) r.fail("intermediate_size", "is missing or not positive");

  c.layers.assign(size_t(L), LayerSpec{});
  for (int64_t i = 0; i < L; ++i) {
    LayerSpec& l = c.layers[size_t(i)];
    if (!full[size_t(i)]) {
      l.mixer = Mixer::sliding_attention;
      l.window = window;
    }
    l.full_rope = full[size_t(i)];
    l.head_dim = head_dim[size_t(i)];
    l.kv_heads = kv_heads[size_t(i)];
    l.k_eq_v = k_eq_v && full[size_t(i)];
    const bool is_shared = i >= first_shared;
    l.intermediate = c.intermediate_size * (double_wide && is_shared && first_shared > 0 ? 2 : 1);
    if (is_shared) {
      for (int64_t j = first_shared - 1; j >= 0 && l.kv_source < 0; --j)
        if (full[size_t(j)] == full[size_t(i)]) l.kv_source = j;
      if (l.kv_source < 0)
        r.fail("num_kv_shared_layers", fmt::format("layer {} shares KV but no earlier layer has its type", i));
      if (head_dim[size_t(l.kv_source)] != l.head_dim || kv_heads[size_t(l.kv_source)] != l.kv_heads)
        r.fail("num_kv_shared_layers", fmt::format("layer {} shares layer {}'s KV but differs in shape", i,
                                                   l.kv_source));
    }
    if (moe) {
      l.mlp = Mlp::moe;
      l.expert_layer = i;
    }
  }
}

// DeepSeek-V3 / V2 (transformers 5.17 DeepseekV3Config / DeepseekV2Config and their modeling files): the MLA shape,
// the router, shared experts and the layer plan. Defaults are the config classes'; what a checkpoint could set that
// tierlm does not compute is refused by name.
void parse_deepseek(const Reader& r, const json::object& o, ModelConfig& c) {
  const bool v3 = c.model_type == "deepseek_v3";
  MlaConfig& m = c.mla;
  auto positive = [&](const char* key, int64_t fallback) {
    const int64_t v = r.integer_or(key, fallback);
    if (v <= 0 || v > (int64_t(1) << 20)) r.fail(key, fmt::format("has an invalid value {}", v));
    return v;
  };
  m.q_lora_rank = r.get("q_lora_rank") ? positive("q_lora_rank", 0) : 0;  // null: q_proj
  m.kv_lora_rank = positive("kv_lora_rank", 512);
  m.qk_nope_head_dim = positive("qk_nope_head_dim", 128);
  m.qk_rope_head_dim = positive("qk_rope_head_dim", 64);
  m.v_head_dim = positive("v_head_dim", 128);
  if (m.qk_rope_head_dim % 2 != 0) r.fail("qk_rope_head_dim", "must be even");
  if (r.get("qk_head_dim") && r.integer("qk_head_dim") != m.qk_head_dim())
    r.fail("qk_head_dim", fmt::format("must be qk_nope_head_dim + qk_rope_head_dim = {}", m.qk_head_dim()));
  // RoPE turns the rope dims only; transformers sets head_dim to qk_rope_head_dim for its rotary embedding.
  c.head_dim = m.qk_rope_head_dim;
  if (c.rope.partial_rotary_factor != 1.0) r.fail("partial_rotary_factor", "must be 1 for MLA (the rope dims rotate)");
  // V2 rotates interleaved pairs (view_as_complex); V3 too unless rope_interleave is false (rotate_half). Both are
  // turned into rotate_half at load by permuting the rope rows of the projections (runtime/model/mla_weights.h).
  if (v3 && !r.boolean_or("rope_interleave", true))
    r.fail("rope_interleave", "false is not supported (only the interleaved rope of the published checkpoints)");
  // DeepseekV2Attention / DeepseekV3Attention: with any rope type but default and a nonzero mscale_all_dim, the
  // softmax scale is multiplied by yarn_mscale(factor, mscale_all_dim)^2 (on top of YaRN's factor on cos and sin).
  m.softmax_scale = 1.0 / std::sqrt(double(m.qk_head_dim()));
  if (const json::object* rope = rope_parameters(o); rope && c.rope.type != "default") {
    const double mscale_all_dim = Reader(*rope, "config.json (rope parameters)").number_or("mscale_all_dim", 0);
    const double mscale = mscale_all_dim != 0 ? yarn_mscale(c.rope.factor, mscale_all_dim) : 1.0;
    m.softmax_scale *= mscale * mscale;
  }
  if (r.boolean_or("attention_bias", false))
    r.fail("attention_bias", fmt::format("(true) is not supported for {} (it changes the model's math and tierlm "
                                         "does not implement it)", c.model_type));
  if (r.boolean_or("mlp_bias", false))
    r.fail("mlp_bias", fmt::format("(true) is not supported for {}", c.model_type));

  c.num_experts = positive("n_routed_experts", v3 ? 256 : 64);
  c.num_experts_per_tok = positive("num_experts_per_tok", v3 ? 8 : 6);
  if (c.num_experts > 65536) r.fail("n_routed_experts", "is out of range");
  if (c.num_experts_per_tok > c.num_experts)
    r.fail("num_experts_per_tok", fmt::format("must be in [1, n_routed_experts = {}]", c.num_experts));
  c.moe_intermediate_size = positive("moe_intermediate_size", v3 ? 2048 : 1407);
  const int64_t shared = r.integer_or("n_shared_experts", v3 ? 1 : 2);
  if (shared < 0 || shared > 64) r.fail("n_shared_experts", fmt::format("has an invalid value {}", shared));
  c.shared_expert_intermediate_size = c.moe_intermediate_size * shared;
  RouterConfig& router = c.router;
  router.routed_scaling_factor = r.number_or("routed_scaling_factor", v3 ? 2.5 : 1.0);
  if (v3) {
    // DeepseekV3TopkRouter: sigmoid scores, e_score_correction_bias for choosing, sum-of-top-2 group scores.
    if (auto f = r.string_or("scoring_func", "sigmoid"); f != "sigmoid")
      r.fail("scoring_func", fmt::format("'{}' is not supported for deepseek_v3 (its router computes sigmoid)", f));
    if (auto t = r.string_or("topk_method", "noaux_tc"); t != "noaux_tc")
      r.fail("topk_method", fmt::format("'{}' is not supported for deepseek_v3 (its router computes noaux_tc)", t));
    router.scoring = RouterConfig::Scoring::sigmoid;
    router.groups = RouterConfig::Groups::top2_sum;
    router.score_correction_bias = true;
    router.n_group = positive("n_group", 8);
    router.topk_group = positive("topk_group", 4);
    c.norm_topk_prob = r.boolean_or("norm_topk_prob", true);
  } else {
    // DeepseekV2Moe: softmax over every expert, greedy or group-limited (best score per group); it never
    // renormalizes (norm_topk_prob is not read by the definition).
    if (auto f = r.string_or("scoring_func", "softmax"); f != "softmax")
      r.fail("scoring_func", fmt::format("'{}' is not supported for deepseek_v2 (its router computes softmax)", f));
    const std::string method = r.string_or("topk_method", "greedy");
    if (method == "group_limited_greedy") {
      router.groups = RouterConfig::Groups::max;
      router.n_group = positive("n_group", 1);
      router.topk_group = positive("topk_group", 1);
    } else if (method != "greedy") {
      r.fail("topk_method", fmt::format("'{}' is not supported (supported: greedy, group_limited_greedy)", method));
    }
    c.norm_topk_prob = false;
  }
  if (router.groups != RouterConfig::Groups::none) {
    if (c.num_experts % router.n_group != 0)
      r.fail("n_group", fmt::format("({}) must divide n_routed_experts ({})", router.n_group, c.num_experts));
    if (router.topk_group > router.n_group)
      r.fail("topk_group", fmt::format("must be in [1, n_group = {}]", router.n_group));
    if (router.groups == RouterConfig::Groups::top2_sum && c.num_experts / router.n_group < 2)
      r.fail("n_group", "leaves groups of fewer than 2 experts (the group score sums the best two)");
    if (c.num_experts_per_tok > router.topk_group * (c.num_experts / router.n_group))
      r.fail("num_experts_per_tok", "exceeds the experts of topk_group groups");
  }
  if (const double freq = r.number_or("moe_layer_freq", 1); freq != 1)
    r.fail("moe_layer_freq", fmt::format("({}) is not supported (supported: 1, every layer from "
                                         "first_k_dense_replace on)", freq));
  const int64_t dense = r.integer_or("first_k_dense_replace", v3 ? 3 : 0);
  if (dense < 0 || dense >= c.num_layers)
    r.fail("first_k_dense_replace", fmt::format("must be in [0, num_hidden_layers = {})", c.num_layers));
  if (dense > 0 && c.intermediate_size <= 0) r.fail("intermediate_size", "is missing or not positive");
  // num_nextn_predict_layers: the multi-token-prediction layers (layers.N for N >= num_hidden_layers) are not part
  // of the causal LM; the loader never reads them.
  if (r.integer_or("num_nextn_predict_layers", 0) < 0) r.fail("num_nextn_predict_layers", "must not be negative");

  c.layers.assign(size_t(c.num_layers), LayerSpec{});
  int64_t expert_layer = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerSpec& l = c.layers[size_t(i)];
    l.mixer = Mixer::mla;
    l.kv_heads = c.num_heads;
    if (i >= dense) {
      l.mlp = Mlp::moe;
      l.expert_layer = expert_layer++;
    }
  }
}

// One "quantization" entry (the top level when `top`): its mode, and group size and bits checked against what the
// kernels run (affine 4/8 bits at group 32/64/128; mxfp4 only as MLX defines it, group 32 and 4 bits). The top level
// must name group_size and bits (mlx-lm always writes them); a module entry defaults them from its mode as
// mx.nn.quantize's to_quantized does (affine 64/4, mxfp4 32/4).
QuantizationConfig::Module parse_quantized_module(const Reader& q, bool top) {
  const std::string mode = q.string_or("mode", "affine");
  if (mode != "affine" && mode != "mxfp4")
    q.fail("mode", fmt::format("'{}' is not supported (supported: affine, mxfp4)", mode));
  QuantizationConfig::Module m;
  m.mxfp4 = mode == "mxfp4";
  m.group_size = int(top ? q.integer("group_size") : q.integer_or("group_size", m.mxfp4 ? 32 : 64));
  m.bits = int(top ? q.integer("bits") : q.integer_or("bits", 4));
  if (m.mxfp4) {
    if (m.group_size != 32) q.fail("group_size", fmt::format("{} is not MXFP4's (32)", m.group_size));
    if (m.bits != 4) q.fail("bits", fmt::format("{} is not MXFP4's (4)", m.bits));
    return m;
  }
  if (m.bits != 4 && m.bits != 8) q.fail("bits", fmt::format("{} is not supported (supported: 4, 8)", m.bits));
  if (m.group_size != 32 && m.group_size != 64 && m.group_size != 128)
    q.fail("group_size", fmt::format("{} is not supported (supported: 32, 64, 128)", m.group_size));
  return m;
}

// gpt-oss (transformers' GptOssConfig / GptOssExperts) beyond the common and MoE keys: the clamp GptOssExperts
// hard-codes, experts_per_token (OpenAI's name) agreeing with num_experts_per_tok, YaRN's factor agreeing with the
// context ratio transformers may use instead, and the default theta / yarn parameters when the config has none.
void parse_gpt_oss(const Reader& r, const json::object& o, ModelConfig& c) {
  c.swiglu_limit = 7.0;
  if (const double limit = r.number_or("swiglu_limit", 7.0); limit != 7.0)
    r.fail("swiglu_limit", fmt::format("({}) is not supported: transformers' GptOssExperts clamps at 7.0 whatever "
                                       "the config says", limit));
  if (const int64_t k = r.integer_or("experts_per_token", c.num_experts_per_tok); k != c.num_experts_per_tok)
    r.fail("experts_per_token", fmt::format("({}) differs from num_experts_per_tok ({})", k, c.num_experts_per_tok));
  if (!o.contains("rope_parameters") && !o.contains("rope_scaling")) {
    // GptOssConfig's defaults.
    c.rope.type = "yarn";
    c.rope.theta = r.number_or("rope_theta", 150000.0);
    c.rope.factor = 32.0;
    c.rope.original_max_position_embeddings = 4096;
    c.rope.beta_fast = 32.0;
    c.rope.beta_slow = 1.0;
    c.rope.truncate = false;
    c.rope.attention_factor = 0.1 * std::log(32.0) + 1.0;
  }
  if (c.rope.type == "yarn" &&
      double(c.max_position_embeddings) / double(c.rope.original_max_position_embeddings) != c.rope.factor)
    r.fail("rope_parameters", fmt::format("yarn factor {} differs from max_position_embeddings / "
                                          "original_max_position_embeddings ({} / {}), which transformers may use "
                                          "instead; not supported", c.rope.factor, c.max_position_embeddings,
                                          c.rope.original_max_position_embeddings));
  if (c.moe_intermediate_size != c.intermediate_size)
    r.fail("moe_intermediate_size", "is not read by gpt_oss (its experts are intermediate_size wide)");
  if (!o.contains("layer_types")) {
    // GptOssConfig's default: even layers sliding, odd layers full.
    const int64_t window = r.integer_or("sliding_window", 128);
    if (window <= 0) r.fail("sliding_window", "must be positive");
    for (size_t i = 0; i < c.layers.size(); i += 2) {
      c.layers[i].mixer = Mixer::sliding_attention;
      c.layers[i].window = window;
    }
  }
  if (c.quantization) {
    // An MLX folder (mlx-lm copies "quantization" into "quantization_config"): the experts are MXFP4 when their
    // module (mlp.experts.gate_proj of some layer) is, by its own entry or the top level's mode.
    bool listed = false;
    for (const auto& [module, m] : c.quantization->modules)
      if (module.ends_with("mlp.experts.gate_proj")) {
        listed = true;
        c.mxfp4_experts = m.mxfp4;
        break;
      }
    if (!listed) c.mxfp4_experts = c.quantization->mxfp4;
  } else if (auto it = o.find("quantization_config"); it != o.end() && it->value().is_object()) {
    // OpenAI's checkpoints: MXFP4 experts, every other module unquantized. transformers quantizes every Linear-like
    // module outside modules_to_not_convert, which on gpt-oss leaves only the experts; a list that leaves more (or
    // other keys) would mean something tierlm does not read.
    const json::object& q = it->value().as_object();
    c.mxfp4_experts = true;
    static const std::set<std::string> expected = {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                   "model.embed_tokens", "lm_head"};
    std::set<std::string> listed;
    if (auto m = q.find("modules_to_not_convert"); m != q.end() && m->value().is_array())
      for (auto& v : m->value().as_array())
        if (v.is_string()) listed.insert(std::string(v.as_string()));
    for (const std::string& module : expected)
      if (!listed.count(module))
        r.fail("quantization_config", fmt::format("modules_to_not_convert lacks '{}': only MXFP4 experts are "
                                                  "supported", module));
    for (auto& kv : q)
      if (kv.key() != "quant_method" && kv.key() != "modules_to_not_convert" &&
          !(kv.key() == "dequantize" && kv.value().is_bool()))
        r.fail("quantization_config", fmt::format("key '{}' is not supported", std::string(kv.key())));
  }
}

}  // namespace

QuantizationConfig::Module QuantizationConfig::dense() const {
  if (!mxfp4 || modules.empty()) return {group_size, bits, mxfp4};
  std::map<std::tuple<int, int, bool>, int> count;
  for (const auto& [name, m] : modules) ++count[{m.group_size, m.bits, m.mxfp4}];
  const auto most = std::max_element(count.begin(), count.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  return {std::get<0>(most->first), std::get<1>(most->first), std::get<2>(most->first)};
}

const ArchitectureSpec* find_architecture(const std::string& model_type) {
  for (auto& spec : table())
    if (spec.model_type == model_type) return &spec;
  return nullptr;
}

const char* mixer_name(Mixer m) {
  switch (m) {
    case Mixer::attention: return "full_attention";
    case Mixer::sliding_attention: return "sliding_attention";
    case Mixer::gated_deltanet: return "linear_attention";
    case Mixer::mla: return "mla";
  }
  return "?";
}

const char* mlp_name(Mlp m) { return m == Mlp::moe ? "moe" : "dense"; }

LayerSpec ModelConfig::layer(int64_t i) const {
  LayerSpec l;
  if (!layers.empty()) {
    l = layers.at(size_t(i));
  } else if (arch.moe) {
    l.mlp = Mlp::moe;
    l.expert_layer = i;
  }
  if (l.head_dim == 0) l.head_dim = head_dim;
  if (l.kv_heads == 0) l.kv_heads = num_kv_heads;
  if (l.intermediate == 0) l.intermediate = intermediate_size;
  return l;
}

const RopeConfig& ModelConfig::rope_of(int64_t i) const {
  return full_attention_rope && layer(i).full_rope ? *full_attention_rope : rope;
}

int64_t ModelConfig::max_q_rows() const {
  int64_t m = 0;
  for (int64_t i = 0; i < num_layers; ++i) m = std::max(m, num_heads * layer(i).head_dim);
  return m;
}

int64_t ModelConfig::max_kv_rows() const {
  int64_t m = 0;
  for (int64_t i = 0; i < num_layers; ++i) m = std::max(m, layer(i).kv_heads * layer(i).head_dim);
  return m;
}

int64_t ModelConfig::max_intermediate() const {
  int64_t m = 0;
  for (int64_t i = 0; i < num_layers; ++i)
    if (layer(i).mlp == Mlp::dense || arch.gemma4) m = std::max(m, layer(i).intermediate);
  return m;
}

int64_t ModelConfig::sparse_layers() const {
  if (layers.empty()) return arch.moe ? num_layers : 0;
  return std::count_if(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.mlp == Mlp::moe; });
}

bool ModelConfig::any_windowed() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.window > 0; });
}

bool ModelConfig::any_recurrent() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.mixer == Mixer::gated_deltanet; });
}

bool ModelConfig::any_mla() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.mixer == Mixer::mla; });
}

kv::StateSpec ModelConfig::state_spec(int64_t i) const {
  const LayerSpec l = layer(i);
  if (l.mixer == Mixer::gated_deltanet) return {0, 0, 0, deltanet.state_bytes()};
  if (l.mixer == Mixer::mla) return {0, 0, 0, 0, mla.latent_floats()};
  // A layer reading another's KV (kv_source) holds none of its own.
  return {l.kv_source >= 0 ? 0 : l.kv_heads, l.head_dim, l.window};
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (auto& spec : table()) names.push_back(spec.model_type);
  return names;
}

ModelConfig parse_config(const std::string& text, const std::string& origin) {
  boost::system::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec) throw ModelError(fmt::format("{}: not valid JSON ({})", origin, ec.message()));
  if (!root.is_object()) throw ModelError(fmt::format("{}: expected a JSON object", origin));
  // Multimodal configs nest the language model under "text_config": its keys are the model's; quantization and
  // tie_word_embeddings may sit at the top.
  const json::object& top = root.as_object();
  const json::object* text_config = nullptr;
  if (auto it = top.find("text_config"); it != top.end() && it->value().is_object())
    text_config = &it->value().as_object();
  const json::object& o = text_config ? *text_config : top;
  const std::string text_origin = text_config ? origin + " (text_config)" : origin;
  Reader r(o, text_origin);
  Reader outer(top, origin);

  ModelConfig c;
  c.model_type = r.string_or("model_type", outer.string_or("model_type", ""));
  if (c.model_type.empty()) r.fail("model_type", "is missing");
  const ArchitectureSpec* spec = find_architecture(c.model_type);
  if (!spec)
    r.fail("model_type", fmt::format("'{}' is not a supported architecture (supported: {})", c.model_type,
                                     fmt::join(supported_architectures(), ", ")));
  c.arch = *spec;
  refuse_unimplemented_keys(o, c.arch, text_origin);
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer_or("intermediate_size", 0);
  c.num_layers = r.integer("num_hidden_layers");
  c.num_heads = r.integer("num_attention_heads");
  c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 4096);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  // Gemma 4 ties embeddings and names its activation hidden_activation (gelu_pytorch_tanh) by default.
  const bool gemma4 = c.arch.gemma4;
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", outer.boolean_or("tie_word_embeddings", gemma4));
  c.hidden_act = gemma4 ? r.string_or("hidden_activation", "gelu_pytorch_tanh") : r.string_or("hidden_act", "silu");
  c.torch_dtype = r.string_or("torch_dtype", r.string_or("dtype", outer.string_or("torch_dtype", "")));
  // Biases: llama-family attention_bias puts one on q, k, v and o (as transformers' LlamaAttention, Qwen3Attention
  // and OlmoeAttention do), mlp_bias on gate, up and down; qwen2_moe's qkv_bias on q, k, v only.
  if (c.arch.reads_attention_bias && r.boolean_or("attention_bias", c.arch.gpt_oss)) c.arch.qkv_bias = c.o_bias = true;
  if (c.arch.reads_mlp_bias) c.mlp_bias = r.boolean_or("mlp_bias", false);
  if (c.arch.reads_qkv_bias) c.arch.qkv_bias = r.boolean_or("qkv_bias", true);

  for (auto [name, value] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                             {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
                             {"num_key_value_heads", c.num_kv_heads}}) {
    if (value <= 0 || value > (int64_t(1) << 24)) r.fail(name, fmt::format("has an invalid value {}", value));
  }
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})", c.num_kv_heads,
                                              c.num_heads));
  c.head_dim = r.integer_or("head_dim", gemma4 ? 256 : 0);
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_heads != 0) r.fail("head_dim", "is missing and hidden_size is not a multiple of heads");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.fail("head_dim", "must be a positive even number");
  if (!gemma4 && c.hidden_act != "silu" && c.hidden_act != "swiglu")
    r.fail("hidden_act", fmt::format("'{}' is not supported (supported: silu)", c.hidden_act));
  if (!gemma4) {
    // qwen3_5 configs default partial_rotary_factor to 0.25 (Qwen3_5TextConfig.__post_init__).
    c.rope = parse_rope(r, o, text_origin, c.arch.linear_attention ? 0.25 : 1.0, c.arch.gpt_oss || c.arch.mla);
    const double f = c.rope.partial_rotary_factor;
    const int64_t rotary = int64_t(double(c.head_dim) * f);
    if (!(f > 0 && f <= 1) || rotary < 2 || rotary % 2 != 0)
      r.fail("partial_rotary_factor", fmt::format("{} leaves {} rotary dims of head_dim {} (must be a positive even "
                                                  "number)", f, rotary, c.head_dim));
  }

  auto bos = token_ids(r, o, "bos_token_id");
  if (bos.empty()) bos = token_ids(outer, top, "bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos.front();
  c.eos_token_ids = token_ids(r, o, "eos_token_id");
  if (c.eos_token_ids.empty()) c.eos_token_ids = token_ids(outer, top, "eos_token_id");

  for (const json::object* where : {&o, &top}) {
    auto it = where->find("quantization");
    if (it == where->end() || !it->value().is_object()) continue;
    Reader q(it->value().as_object(), origin + " (quantization)");
    const QuantizationConfig::Module top = parse_quantized_module(q, true);
    QuantizationConfig qc;
    qc.group_size = top.group_size;
    qc.bits = top.bits;
    qc.mxfp4 = top.mxfp4;
    for (auto& entry : it->value().as_object()) {
      if (!entry.value().is_object()) continue;  // group_size, bits, mode; `false`: a module left unquantized
      const std::string module(entry.key());
      qc.modules[module] =
          parse_quantized_module(Reader(entry.value().as_object(), origin + " (quantization." + module + ")"), false);
    }
    c.quantization = qc;
    break;
  }

  if (gemma4) {
    parse_gemma4(r, o, c);
    warn_unread_keys(o, c.arch, text_origin);
    return c;
  }
  if (c.arch.mla) {
    parse_deepseek(r, o, c);
    warn_unread_keys(o, c.arch, text_origin);
    return c;
  }
  c.num_experts = r.integer_or("num_experts", r.integer_or("num_local_experts", 0));
  c.num_experts_per_tok = r.integer_or("num_experts_per_tok", 0);
  c.moe_intermediate_size = r.integer_or("moe_intermediate_size", c.intermediate_size);
  c.shared_expert_intermediate_size = r.integer_or("shared_expert_intermediate_size", 0);
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
  if (c.arch.moe) {
    if (c.num_experts <= 0 || c.num_experts > 65536) r.fail("num_experts", "is missing or out of range");
    if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
      r.fail("num_experts_per_tok", fmt::format("must be in [1, num_experts = {}]", c.num_experts));
    if (c.moe_intermediate_size <= 0) r.fail("moe_intermediate_size", "is missing or not positive");
    if (c.arch.shared_expert && c.shared_expert_intermediate_size <= 0)
      r.fail("shared_expert_intermediate_size", "is missing or not positive");
  }
  c.layers = expand_layers(r, o, c);
  if (c.arch.gpt_oss) parse_gpt_oss(r, o, c);
  if (c.arch.linear_attention) {
    // The attention layers' biases: Qwen3_5Attention puts attention_bias on q/k/v/o; not implemented here.
    if (r.boolean_or("attention_bias", false))
      r.fail("attention_bias", fmt::format("(true) is not supported for {} (it changes the model's math and tierlm "
                                           "does not implement it)", c.model_type));
  }
  if (c.any_recurrent()) {
    DeltaNetConfig& d = c.deltanet;
    auto positive = [&](const char* key) {
      const int64_t v = r.integer(key);
      if (v <= 0 || v > (int64_t(1) << 20)) r.fail(key, fmt::format("has an invalid value {}", v));
      return v;
    };
    d.conv_kernel = positive("linear_conv_kernel_dim");
    d.key_heads = positive("linear_num_key_heads");
    d.value_heads = positive("linear_num_value_heads");
    d.key_head_dim = positive("linear_key_head_dim");
    d.value_head_dim = positive("linear_value_head_dim");
    if (d.value_heads % d.key_heads != 0)
      r.fail("linear_num_value_heads", fmt::format("({}) must be a multiple of linear_num_key_heads ({})",
                                                   d.value_heads, d.key_heads));
    if (d.value_head_dim > 1024) r.fail("linear_value_head_dim", "above 1024 is not supported");
  }
  if (c.sparse_layers() < c.num_layers && c.intermediate_size <= 0)
    r.fail("intermediate_size", "is missing or not positive (the model has dense MLP layers)");
  warn_unread_keys(o, c.arch, text_origin);
  return c;
}

ModelConfig load_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(model_dir))
      throw ModelError(fmt::format("model folder '{}' does not exist", model_dir.string()));
    throw ModelError(fmt::format("{}: cannot open (is this a Hugging Face model folder?)", path.string()));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path.string());
}

}  // namespace tierlm::model
