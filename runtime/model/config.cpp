#include "runtime/model/config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/model/safetensors.h"

namespace tierlm::model {

namespace json = boost::json;

namespace {

// The architecture table: everything that differs between families is a field here, not a forward pass.
const std::vector<ArchitectureSpec>& table() {
  static const std::vector<ArchitectureSpec> specs = {
      {"llama", false, false, false},
      {"mistral", false, false, false},
      {"qwen2", true, false, false},
      {"qwen3", false, true, false},
      // Mixture-of-experts families: experts live in the expert tier (tiering/), the rest loads like a dense model.
      {"qwen3_moe", false, true, true},
      {"mixtral", false, false, true, false, true, false, "block_sparse_moe", "w1", "w3", "w2"},
      {"olmoe", false, true, true, true},
      {"qwen2_moe", true, false, true, false, false, true},
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

RopeConfig parse_rope(const Reader& top, const json::object& root, const std::string& origin) {
  RopeConfig rope;
  rope.theta = top.number_or("rope_theta", 10000.0);
  // transformers >= 5 writes "rope_parameters"; older configs (and most published models) "rope_scaling".
  const json::object* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = root.find(key);
    if (it != root.end() && it->value().is_object()) {
      params = &it->value().as_object();
      break;
    }
  }
  if (!params) return rope;
  Reader r(*params, origin + " (rope parameters)");
  rope.theta = r.number_or("rope_theta", rope.theta);
  rope.type = r.string_or("rope_type", r.string_or("type", "default"));
  rope.factor = r.number_or("factor", 1.0);
  rope.low_freq_factor = r.number_or("low_freq_factor", 1.0);
  rope.high_freq_factor = r.number_or("high_freq_factor", 4.0);
  rope.original_max_position_embeddings = r.integer_or("original_max_position_embeddings", 8192);
  if (rope.type != "default" && rope.type != "linear" && rope.type != "llama3")
    r.fail("rope_type", fmt::format("'{}' is not supported (supported: default, linear, llama3)", rope.type));
  if (rope.theta <= 0) r.fail("rope_theta", "must be positive");
  if (rope.type != "default" && rope.factor <= 0) r.fail("factor", "must be positive");
  return rope;
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

}  // namespace

const ArchitectureSpec* find_architecture(const std::string& model_type) {
  for (auto& spec : table())
    if (spec.model_type == model_type) return &spec;
  return nullptr;
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
  const json::object& o = root.as_object();
  // Multimodal configs nest the language model under "text_config".
  Reader r(o, origin);

  ModelConfig c;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type.empty()) r.fail("model_type", "is missing");
  const ArchitectureSpec* spec = find_architecture(c.model_type);
  if (!spec)
    r.fail("model_type", fmt::format("'{}' is not a supported architecture (supported: {})", c.model_type,
                                     fmt::join(supported_architectures(), ", ")));
  c.arch = *spec;
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer_or("intermediate_size", 0);
  c.num_layers = r.integer("num_hidden_layers");
  c.num_heads = r.integer("num_attention_heads");
  c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 4096);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.hidden_act = r.string_or("hidden_act", "silu");
  c.torch_dtype = r.string_or("torch_dtype", r.string_or("dtype", ""));
  if (r.boolean_or("attention_bias", false)) c.arch.qkv_bias = true;

  for (auto [name, value] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                             {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
                             {"num_key_value_heads", c.num_kv_heads}}) {
    if (value <= 0 || value > (int64_t(1) << 24)) r.fail(name, fmt::format("has an invalid value {}", value));
  }
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})", c.num_kv_heads,
                                              c.num_heads));
  c.head_dim = r.integer_or("head_dim", 0);
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_heads != 0) r.fail("head_dim", "is missing and hidden_size is not a multiple of heads");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.fail("head_dim", "must be a positive even number");
  if (!c.arch.moe && c.intermediate_size <= 0) r.fail("intermediate_size", "is missing or not positive");
  if (c.hidden_act != "silu" && c.hidden_act != "swiglu")
    r.fail("hidden_act", fmt::format("'{}' is not supported (supported: silu)", c.hidden_act));
  c.rope = parse_rope(r, o, origin);

  auto bos = token_ids(r, o, "bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos.front();
  c.eos_token_ids = token_ids(r, o, "eos_token_id");

  if (auto it = o.find("quantization"); it != o.end() && it->value().is_object()) {
    Reader q(it->value().as_object(), origin + " (quantization)");
    QuantizationConfig qc;
    qc.group_size = int(q.integer("group_size"));
    qc.bits = int(q.integer("bits"));
    if (qc.bits != 4 && qc.bits != 8) q.fail("bits", fmt::format("{} is not supported (supported: 4, 8)", qc.bits));
    if (qc.group_size != 32 && qc.group_size != 64 && qc.group_size != 128)
      q.fail("group_size", fmt::format("{} is not supported (supported: 32, 64, 128)", qc.group_size));
    c.quantization = qc;
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
    // Dense MLP layers interleaved with sparse ones (qwen2_moe/qwen3_moe options) are not supported yet.
    if (r.integer_or("decoder_sparse_step", 1) != 1) r.fail("decoder_sparse_step", "other than 1 is not supported");
    if (auto it = o.find("mlp_only_layers");
        it != o.end() && it->value().is_array() && !it->value().as_array().empty())
      r.fail("mlp_only_layers", "is not supported (every layer must be sparse)");
  }
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
