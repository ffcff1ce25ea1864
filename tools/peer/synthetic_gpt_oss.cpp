// tools/peer/synthetic_gpt_oss.cpp — writes a random-weight gpt-oss-20b-shaped model folder as OpenAI's published
// Hugging Face checkpoint stores it (/work/shared/reference/quant-layouts.md section 1): config.json with the
// published keys (24 layers, 32 local experts top-4, hidden 2880, intermediate 2880, 64 q / 8 KV heads of 64, vocab
// 201088, layer_types sliding/full alternating with sliding_window 128, YaRN rope_scaling factor 32 over 4096,
// rope_theta 150000, swiglu_limit 7.0, attention_bias, quantization_config mxfp4 with its modules_to_not_convert),
// generation_config.json, shards named as transformers' converter names them (`model-0000i-of-0000{n-1}`, metadata
// {"format": "pt"}) with model.safetensors.index.json. Per layer the 19 published tensors: experts as
// mlp.experts.{gate_up,down}_proj_{blocks,scales} (U8: FP4 E2M1 nibbles, low nibble first, and one E8M0 exponent
// per 32 values; rows are output features, gate/up interleaved) and _bias (BF16); router, attention (with biases
// and sinks), norms, embedding and untied lm_head BF16. The real tokenizer and chat template are copied in when
// given (--tokenizer DIR: tokenizer.json, tokenizer_config.json, chat_template.jinja).
//
// Weights: BF16 matrices uniform with std 1/sqrt(in) (so a normalized input gives unit-std outputs); the two that
// write the residual stream (o_proj, experts' down_proj) kOutputScale times that, so its RMS grows slowly with depth;
// biases small; norms ~1. MXFP4: uniform random nibbles (E2M1 rms 2.93) and per-block exponents picked around the
// same target std.
//
// Routing shaped like a trained model's, through the real router (the bench runs it unchanged): gpt-oss's router
// has a bias, so the popularity is that bias: expert e of layer l gets -zipf * ln(rank_l(e) + 1) for a fixed random
// rank order per layer, beside the token-dependent x . r_e (unit std for the normalized x). Top-4 on those logits
// gives a Zipf-like popularity of exponent ~zipf; the skew it gives (share of the most popular experts, reuse
// between consecutive tokens) is measured by bench/routing_stats_bench, not assumed.
// Owns: the shape and a deterministic, fast generator. Never: write outside the folder it is given.
//
// Usage: synthetic_gpt_oss OUT_DIR [--tokenizer DIR] [--layers N] [--zipf S] [--seed S]  (prints bytes written)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tools/peer/synthetic_routing.h"

namespace {

namespace fs = std::filesystem;
using tierlm::peer::Rng;

constexpr uint64_t kShardLimit = 5'000'000'000ull;  // the published 20b: three shards of <= 5 GB

using tierlm::peer::kOutputScale;  // o_proj / down_proj std relative to 1/sqrt(in)
constexpr float kBiasStd = 0.02f;
constexpr float kE2M1Rms = 2.926f;  // rms of the 16 E2M1 values {0, .5, 1, 1.5, 2, 3, 4, 6} and their negatives

struct Shape {
  int64_t vocab = 201088, hidden = 2880, intermediate = 2880, layers = 24, heads = 64, kv_heads = 8, head_dim = 64;
  int64_t experts = 32, top_k = 4, sliding_window = 128;
};

enum class Fill : uint8_t {
  matrix,         // BF16 uniform, std = scale / sqrt(in)
  bias,           // BF16 uniform, std kBiasStd
  norm,           // BF16 1 +- 2.5%
  sinks,          // BF16 uniform in [0, 1): one logit per q head
  router_bias,    // BF16 -zipf * ln(rank + 1), a fixed random rank order per layer
  mxfp4_blocks,   // U8 random nibbles
  mxfp4_scales,   // U8 E8M0 exponents for std scale / sqrt(in)
};

struct Tensor {
  std::string name, dtype;  // "BF16", "U8"
  std::vector<int64_t> shape;
  Fill fill = Fill::matrix;
  int64_t in = 1;      // the logical input width (for the std)
  float scale = 1.0f;  // std multiplier (kOutputScale for the residual writers)
  int64_t layer = 0;
  uint64_t elements() const {
    return uint64_t(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()));
  }
  uint64_t bytes() const { return elements() * (dtype == "BF16" ? 2 : 1); }
};

// bf16 of a finite float, rounded to nearest even (the generator's values are all small and finite).
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

std::vector<Tensor> tensors_of(const Shape& s) {
  std::vector<Tensor> t;
  const int64_t H = s.hidden, I = s.intermediate, E = s.experts, q = s.heads * s.head_dim;
  const int64_t kv = s.kv_heads * s.head_dim;
  t.push_back({"model.embed_tokens.weight", "BF16", {s.vocab, H}, Fill::matrix, 1});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    auto add = [&](const std::string& name, const char* dtype, std::vector<int64_t> shape, Fill fill, int64_t in = 1,
                   float scale = 1.0f) { t.push_back({p + name, dtype, std::move(shape), fill, in, scale, l}); };
    add("input_layernorm.weight", "BF16", {H}, Fill::norm);
    add("self_attn.q_proj.weight", "BF16", {q, H}, Fill::matrix, H);
    add("self_attn.q_proj.bias", "BF16", {q}, Fill::bias);
    add("self_attn.k_proj.weight", "BF16", {kv, H}, Fill::matrix, H);
    add("self_attn.k_proj.bias", "BF16", {kv}, Fill::bias);
    add("self_attn.v_proj.weight", "BF16", {kv, H}, Fill::matrix, H);
    add("self_attn.v_proj.bias", "BF16", {kv}, Fill::bias);
    add("self_attn.o_proj.weight", "BF16", {H, q}, Fill::matrix, q, kOutputScale);
    add("self_attn.o_proj.bias", "BF16", {H}, Fill::bias);
    add("self_attn.sinks", "BF16", {s.heads}, Fill::sinks);
    add("post_attention_layernorm.weight", "BF16", {H}, Fill::norm);
    add("mlp.router.weight", "BF16", {E, H}, Fill::matrix, H);
    add("mlp.router.bias", "BF16", {E}, Fill::router_bias);
    add("mlp.experts.gate_up_proj_blocks", "U8", {E, 2 * I, H / 32, 16}, Fill::mxfp4_blocks);
    add("mlp.experts.gate_up_proj_scales", "U8", {E, 2 * I, H / 32}, Fill::mxfp4_scales, H);
    add("mlp.experts.gate_up_proj_bias", "BF16", {E, 2 * I}, Fill::bias);
    add("mlp.experts.down_proj_blocks", "U8", {E, H, I / 32, 16}, Fill::mxfp4_blocks);
    add("mlp.experts.down_proj_scales", "U8", {E, H, I / 32}, Fill::mxfp4_scales, I, kOutputScale);
    add("mlp.experts.down_proj_bias", "BF16", {E, H}, Fill::bias);
  }
  t.push_back({"model.norm.weight", "BF16", {H}, Fill::norm});
  t.push_back({"lm_head.weight", "BF16", {s.vocab, H}, Fill::matrix, H});
  return t;
}

class Generator {
 public:
  Generator(const Shape& s, double zipf, uint64_t seed) : s_(s), zipf_(zipf), seed_(seed) {}

  // The bytes of one tensor in pieces of at most ~16 MB (an expert tensor is up to 265 MB).
  template <class Sink>
  void produce(const Tensor& t, Sink&& sink) {
    Rng rng{seed_ ^ std::hash<std::string>()(t.name)};
    const uint64_t n = t.elements(), piece = uint64_t(1) << 23;
    if (t.dtype == "U8") {
      std::vector<uint8_t> out(size_t(std::min(n, piece)));
      // E8M0 exponent e gives values LUT * 2^(e - 127): pick e so that the std is near the target, alternating
      // randomly between the two exponents around it.
      const double target = t.scale / std::sqrt(double(t.in)) / kE2M1Rms;
      const int low = 127 + int(std::floor(std::log2(target)));
      for (uint64_t done = 0; done < n; done += piece) {
        const size_t m = size_t(std::min(piece, n - done));
        if (t.fill == Fill::mxfp4_blocks) {
          for (size_t i = 0; i < m; i += 8) {
            const uint64_t bits = rng.next();
            std::memcpy(&out[i], &bits, std::min<size_t>(8, m - i));
          }
        } else {
          for (size_t i = 0; i < m; ++i) out[i] = uint8_t(low + int(rng.next() & 1));
        }
        sink(out.data(), m);
      }
      return;
    }
    std::vector<uint16_t> out(size_t(std::min(n, piece)));
    const float half_width = std::sqrt(3.0f) * t.scale / std::sqrt(float(t.in));  // uniform [-a, a]: std a / sqrt(3)
    for (uint64_t done = 0; done < n; done += piece) {
      const size_t m = size_t(std::min(piece, n - done));
      for (size_t i = 0; i < m; ++i) {
        const uint64_t index = done + i;
        float v = 0;
        switch (t.fill) {
          case Fill::matrix: v = half_width * (2 * rng.uniform() - 1); break;
          case Fill::bias: v = std::sqrt(3.0f) * kBiasStd * (2 * rng.uniform() - 1); break;
          case Fill::norm: v = 1.0f + 0.05f * (rng.uniform() - 0.5f); break;
          case Fill::sinks: v = rng.uniform(); break;
          case Fill::router_bias: v = router_bias(t.layer, int64_t(index)); break;
          default: throw std::logic_error("fill of a U8 tensor on a BF16 one");
        }
        out[i] = f32_to_bf16(v);
      }
      sink(out.data(), m * 2);
    }
  }

 private:
  float router_bias(int64_t layer, int64_t expert) {
    const std::vector<int32_t> rank = tierlm::peer::expert_ranks(seed_, layer, s_.experts);
    return float(-zipf_ * std::log(double(rank[size_t(expert)] + 1)));
  }

  Shape s_;
  double zipf_;
  uint64_t seed_;
};

std::string layer_types(const Shape& s) {
  std::vector<std::string> types;
  for (int64_t l = 0; l < s.layers; ++l) types.push_back(l % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  return fmt::format("{}", fmt::join(types, ", "));
}

void write_config(const fs::path& dir, const Shape& s) {
  std::ofstream out(dir / "config.json");
  out << fmt::format(R"({{
  "architectures": ["GptOssForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": 200002,
  "experts_per_token": {},
  "head_dim": {},
  "hidden_act": "silu",
  "hidden_size": {},
  "initial_context_length": 4096,
  "initializer_range": 0.02,
  "intermediate_size": {},
  "layer_types": [{}],
  "max_position_embeddings": 131072,
  "model_type": "gpt_oss",
  "num_attention_heads": {},
  "num_experts_per_tok": {},
  "num_hidden_layers": {},
  "num_key_value_heads": {},
  "num_local_experts": {},
  "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {{
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"
  }},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {{"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                   "rope_type": "yarn", "truncate": false}},
  "rope_theta": 150000,
  "router_aux_loss_coef": 0.9,
  "sliding_window": {},
  "swiglu_limit": 7.0,
  "tie_word_embeddings": false,
  "transformers_version": "4.55.0.dev0",
  "use_cache": true,
  "vocab_size": {}
}}
)",
                     s.top_k, s.head_dim, s.hidden, s.intermediate, layer_types(s), s.heads, s.top_k, s.layers,
                     s.kv_heads, s.experts, s.sliding_window, s.vocab);
  std::ofstream gen(dir / "generation_config.json");
  gen << R"({"bos_token_id": 199998, "do_sample": true, "eos_token_id": [200002, 199999, 200012],)"
      << R"( "pad_token_id": 199999, "transformers_version": "4.55.0.dev0"})" << "\n";
  if (!out || !gen) throw std::runtime_error("cannot write " + dir.string() + "/config.json");
}

uint64_t write_shards(const fs::path& dir, const std::vector<Tensor>& tensors, Generator& gen) {
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t bytes;
    const Tensor* tensor;
  };
  std::vector<Entry> entries;
  for (const auto& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes(), &t});
  // transformers' convert_gpt_oss_weights_to_hf numbers shards 0..n-1 "of" n-1 (quant-layouts.md section 1a).
  return tierlm::peer::write_shards(
      dir, entries, kShardLimit, "pt", "synthetic_gpt_oss",
      [&](const Entry& e, auto&& sink) { gen.produce(*e.tensor, sink); },
      [](size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i, std::max<size_t>(n, 2) - 1); });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const tierlm::peer::ToolArgs args = tierlm::peer::parse_tool_args(
        argc, argv, "usage: synthetic_gpt_oss OUT_DIR [--tokenizer DIR] [--layers N] [--zipf S] [--seed S]",
        {"--tokenizer", "--layers", "--zipf", "--seed"});
    const fs::path& dir = args.dir;
    Shape shape;
    if (args.has("--layers")) shape.layers = std::stoll(args.at("--layers"));
    const double zipf = args.has("--zipf") ? std::stod(args.at("--zipf")) : 0.8;
    const uint64_t seed = args.has("--seed") ? std::stoull(args.at("--seed")) : 1;
    const fs::path tokenizer = args.has("--tokenizer") ? args.at("--tokenizer") : "";
    if (shape.layers < 1) throw std::invalid_argument("--layers must be positive");
    fs::create_directories(dir);
    write_config(dir, shape);
    if (!tokenizer.empty()) {
      if (!fs::exists(tokenizer / "tokenizer.json"))
        throw std::invalid_argument("--tokenizer DIR must hold gpt-oss's tokenizer.json");
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
        if (fs::exists(tokenizer / f)) fs::copy_file(tokenizer / f, dir / f, fs::copy_options::overwrite_existing);
    }
    Generator gen(shape, zipf, seed);
    const uint64_t total = write_shards(dir, tensors_of(shape), gen);
    std::fprintf(stderr, "synthetic_gpt_oss: wrote %s (%lld layers)\n", dir.c_str(), static_cast<long long>(shape.layers));
    std::printf("%llu\n", static_cast<unsigned long long>(total));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_gpt_oss: %s\n", e.what());
    return 1;
  }
}
