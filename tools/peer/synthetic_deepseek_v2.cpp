// tools/peer/synthetic_deepseek_v2.cpp — writes a random-weight DeepSeek-V2-Lite-shaped model as the published
// checkpoint stores it: config.json (deepseek-ai/DeepSeek-V2-Lite's, YaRN rope_scaling included: the copy in
// profiles/fit-configs/deepseek-v2-lite), bf16 model-0000i-of-0000n.safetensors shards with
// model.safetensors.index.json, Hugging Face tensor names (per-expert mlp.experts.N.{gate,up,down}_proj, q_proj
// without q LoRA, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj, mlp.gate, mlp.shared_experts, layer 0 a
// dense MLP), and the tokenizer of --tokenizer DIR cut to the model's 102400 ids (copy_tokenizer; V2-Lite's own is
// not available offline: DeepSeek-V3's is the nearest). 31.4 GB, as the hub lists the real one.
// Routing skew as tools/peer/synthetic_routing.h describes (softmax over mlp.gate's logits: the same top-k).
// Owns: the shape and the deterministic weight generator. Never: write anything but the folder it is given.
//
// Usage: synthetic_deepseek_v2 OUT_DIR --config CONFIG_JSON --tokenizer DIR [--layers N] [--zipf S] [--seed S]
//        [--tokenizer-only 1]   (config.json and the tokenizer only, beside shards already written)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/kernels/kernel_isa.h"
#include "tools/peer/synthetic_routing.h"

namespace {

namespace fs = std::filesystem;
using tierlm::kernels::f32_to_bf16;
using tierlm::peer::Rng;

struct Shape {
  int64_t vocab, hidden, intermediate, moe_intermediate, layers, heads, experts, shared, dense_layers;
  int64_t kv_lora, rope, nope, v;
};

Shape shape_of(const boost::json::object& c) {
  auto i = [&](const char* k) { return c.at(k).to_number<int64_t>(); };
  if (c.at("model_type").as_string() != "deepseek_v2" || !c.at("q_lora_rank").is_null())
    throw std::invalid_argument("--config must be a deepseek_v2 config without q LoRA (V2-Lite's)");
  return {i("vocab_size"), i("hidden_size"), i("intermediate_size"), i("moe_intermediate_size"),
          i("num_hidden_layers"), i("num_attention_heads"), i("n_routed_experts"), i("n_shared_experts"),
          i("first_k_dense_replace"), i("kv_lora_rank"), i("qk_rope_head_dim"), i("qk_nope_head_dim"),
          i("v_head_dim")};
}

enum class Fill : uint8_t { random, writes_residual, embedding, router, norm };

struct Tensor {
  std::string name;
  std::string dtype = "BF16";
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  Fill fill = Fill::random;
  int64_t layer = 0;
  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return shape.size() > 1 ? shape[1] : 1; }
};

std::vector<Tensor> tensors_of(const Shape& s) {
  std::vector<Tensor> t;
  auto add = [&](std::string name, std::vector<int64_t> shape, Fill fill, int64_t layer) {
    uint64_t n = 2;
    for (int64_t d : shape) n *= uint64_t(d);
    t.push_back({std::move(name), "BF16", std::move(shape), n, fill, layer});
  };
  const int64_t H = s.hidden, nh = s.heads;
  add("model.embed_tokens.weight", {s.vocab, H}, Fill::embedding, 0);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {H}, Fill::norm, l);
    add(p + "post_attention_layernorm.weight", {H}, Fill::norm, l);
    add(p + "self_attn.q_proj.weight", {nh * (s.nope + s.rope), H}, Fill::random, l);
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {s.kv_lora + s.rope, H}, Fill::random, l);
    add(p + "self_attn.kv_a_layernorm.weight", {s.kv_lora}, Fill::norm, l);
    add(p + "self_attn.kv_b_proj.weight", {nh * (s.nope + s.v), s.kv_lora}, Fill::random, l);
    add(p + "self_attn.o_proj.weight", {H, nh * s.v}, Fill::writes_residual, l);
    auto mlp = [&](const std::string& m, int64_t inter) {
      add(m + "gate_proj.weight", {inter, H}, Fill::random, l);
      add(m + "up_proj.weight", {inter, H}, Fill::random, l);
      add(m + "down_proj.weight", {H, inter}, Fill::writes_residual, l);
    };
    if (l < s.dense_layers) {
      mlp(p + "mlp.", s.intermediate);
      continue;
    }
    add(p + "mlp.gate.weight", {s.experts, H}, Fill::router, l);
    mlp(p + "mlp.shared_experts.", s.moe_intermediate * s.shared);
    for (int64_t e = 0; e < s.experts; ++e) mlp(p + fmt::format("mlp.experts.{}.", e), s.moe_intermediate);
  }
  add("model.norm.weight", {H}, Fill::norm, 0);
  add("lm_head.weight", {s.vocab, H}, Fill::random, 0);
  return t;
}

// Uniform values of the target std (a = std * sqrt(3)), 4 per 64 random bits: 15.7 G values in seconds.
void uniform_row(Rng& rng, float target, uint16_t* out, int64_t n) {
  const float step = target * std::sqrt(3.0f) / 32768.0f;
  for (int64_t j = 0; j < n; j += 4) {
    const uint64_t bits = rng.next();
    for (int64_t k = 0; k < 4 && j + k < n; ++k)
      out[j + k] = f32_to_bf16(step * (float(int((bits >> (16 * k)) & 0xFFFF)) - 32768.0f));
  }
}

class Generator {
 public:
  Generator(const Shape& s, double zipf, uint64_t seed) : s_(s), zipf_(zipf), seed_(seed) {}

  template <class Sink>
  void produce(const Tensor& t, Sink&& sink) {
    const int64_t rows = t.rows(), cols = t.cols();
    Rng rng{seed_ ^ std::hash<std::string>()(t.name)};
    if (t.fill == Fill::norm) {
      std::vector<uint16_t> v(static_cast<size_t>(rows));
      for (auto& x : v) x = f32_to_bf16(1.0f + 0.05f * (rng.uniform() - 0.5f));
      sink(v.data(), v.size() * 2);
      return;
    }
    const std::vector<int32_t> ranks =
        t.fill == Fill::router ? tierlm::peer::expert_ranks(seed_, t.layer, rows) : std::vector<int32_t>{};
    const int64_t chunk_rows = std::max<int64_t>(1, (int64_t(8) << 20) / cols);
    std::vector<uint16_t> buffer(size_t(chunk_rows * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    const float target = t.fill == Fill::embedding         ? 1.0f
                         : t.fill == Fill::writes_residual ? tierlm::peer::kOutputScale / std::sqrt(float(cols))
                                                           : 1.0f / std::sqrt(float(cols));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t* out = &buffer[size_t(i * cols)];
        const int64_t r = r0 + i;
        if (t.fill == Fill::router) {
          tierlm::peer::router_row(cols, t.layer, ranks[size_t(r)], zipf_, rng, row.data());
          for (int64_t j = 0; j < cols; ++j) out[j] = f32_to_bf16(row[size_t(j)]);
          continue;
        }
        if (t.fill == Fill::writes_residual && r == 0) {  // nothing writes residual channel 0
          std::fill(out, out + cols, uint16_t(0));
          continue;
        }
        uniform_row(rng, target, out, cols);
        if (t.fill == Fill::embedding) out[0] = f32_to_bf16(tierlm::peer::kMassive);
      }
      sink(buffer.data(), size_t(n * cols) * 2);
    }
  }

 private:
  Shape s_;
  double zipf_;
  uint64_t seed_;
};

// The tokenizer, kept inside the model's vocab: a BPE tokenizer.json with more tokens than the embedding has rows
// (DeepSeek-V3's 128K for V2-Lite's 102400) loses the tokens past it, every merge that makes or uses one, and the
// added tokens past it, so no encoding can produce an id the model cannot embed.
void copy_tokenizer(const fs::path& from, const fs::path& to, int64_t vocab) {
  std::ifstream in(from / "tokenizer.json");
  boost::json::object t = boost::json::parse(std::string(std::istreambuf_iterator<char>(in), {})).as_object();
  boost::json::object& model = t.at("model").as_object();
  boost::json::object kept;
  for (auto& kv : model.at("vocab").as_object())
    if (kv.value().to_number<int64_t>() < vocab) kept.emplace(kv.key(), kv.value());
  boost::json::array merges;
  for (auto& m : model.at("merges").as_array()) {
    std::string a, b;
    if (m.is_string()) {
      const std::string pair(m.as_string());
      const size_t space = pair.find(' ');
      a = pair.substr(0, space), b = pair.substr(space + 1);
    } else {
      a = std::string(m.as_array().at(0).as_string()), b = std::string(m.as_array().at(1).as_string());
    }
    if (kept.contains(a) && kept.contains(b) && kept.contains(a + b)) merges.push_back(m);
  }
  const size_t dropped = model.at("vocab").as_object().size() - kept.size();
  model["vocab"] = std::move(kept);
  model["merges"] = std::move(merges);
  boost::json::array added;
  for (auto& a : t.at("added_tokens").as_array())
    if (a.as_object().at("id").to_number<int64_t>() < vocab) added.push_back(a);
  t["added_tokens"] = std::move(added);
  std::ofstream(to / "tokenizer.json") << boost::json::serialize(t);
  if (fs::exists(from / "tokenizer_config.json"))
    fs::copy_file(from / "tokenizer_config.json", to / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  std::fprintf(stderr, "synthetic_deepseek_v2: tokenizer from %s without its %zu tokens past id %lld\n", from.c_str(),
               dropped, static_cast<long long>(vocab - 1));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const char* usage =
        "usage: synthetic_deepseek_v2 OUT_DIR --config CONFIG_JSON --tokenizer DIR [--layers N] [--zipf S] [--seed S] "
        "[--tokenizer-only 1]";
    const tierlm::peer::ToolArgs args = tierlm::peer::parse_tool_args(
        argc, argv, usage, {"--config", "--tokenizer", "--layers", "--zipf", "--seed", "--tokenizer-only"});
    const fs::path& dir = args.dir;
    const fs::path config_path = args.has("--config") ? args.at("--config") : "";
    const fs::path tokenizer = args.has("--tokenizer") ? args.at("--tokenizer") : "";
    const double zipf = args.has("--zipf") ? std::stod(args.at("--zipf")) : 0.8;
    const uint64_t seed = args.has("--seed") ? std::stoull(args.at("--seed")) : 1;
    const int64_t layers = args.has("--layers") ? std::stoll(args.at("--layers")) : 0;
    const bool tokenizer_only = args.has("--tokenizer-only") && args.at("--tokenizer-only") == "1";
    if (config_path.empty() || tokenizer.empty() || !fs::exists(tokenizer / "tokenizer.json"))
      throw std::invalid_argument(usage);
    std::ifstream in(config_path);
    boost::json::object config =
        boost::json::parse(std::string(std::istreambuf_iterator<char>(in), {})).as_object();
    if (layers > 0) config["num_hidden_layers"] = layers;
    const Shape shape = shape_of(config);
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << boost::json::serialize(config) << "\n";
    copy_tokenizer(tokenizer, dir, shape.vocab);
    if (tokenizer_only) return 0;
    Generator gen(shape, zipf, seed);
    const uint64_t total = tierlm::peer::write_shards(
        dir, tensors_of(shape), 5'000'000'000ull, "pt", "synthetic_deepseek_v2",
        [&](const Tensor& t, auto&& sink) { gen.produce(t, sink); });
    std::fprintf(stderr, "synthetic_deepseek_v2: wrote %s (%lld layers, %.2f GB)\n", dir.c_str(),
                 static_cast<long long>(shape.layers), double(total) / 1e9);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_deepseek_v2: %s\n", e.what());
    return 1;
  }
}
