// tools/peer/synthetic_mlx_moe.cpp — writes a random-weight Qwen3-30B-A3B-shaped model as a user's mlx-community
// 4-bit folder has it: config.json with "quantization" {group_size 64, bits 4}, model-0000i-of-0000n.safetensors
// shards (<= 5 GB, mlx-lm's limit) with model.safetensors.index.json, every Linear and the embedding MLX affine
// 4-bit (uint32 codes, bf16 scales and biases per group of 64; the router mlp.gate too, as mlx-lm's qwen3_moe has
// no 8-bit predicate), experts stacked as mlp.switch_mlp.{gate,up,down}_proj [experts, out, in], norms bf16, and
// the tokenizer files of a real Qwen3 (copied from --tokenizer DIR). The source of bench/realscale.sh's two models:
// tierlm reads this folder, gguf_export --from-mlx repacks the same codes for llama.cpp.
//
// Routing shaped like a trained model's (the router is not bypassed; the bench runs the real router):
//   popularity  the "massive activation" skew of tools/peer/synthetic_routing.h (Zipf-like, exponent ~zipf).
//   reuse       consecutive tokens share what attention carries (the mean of the context's values), so a token
//               repeats some of the previous token's experts beyond what popularity alone gives; measured, not set.
//   Both measured by bench/routing_stats (per-layer share of the top 10% experts, overlap with the previous token).
// Owns: the shape, the deterministic weight generator. Never: write anything but the folder it is given.
//
// Usage: synthetic_mlx_moe OUT_DIR --tokenizer DIR [--layers N] [--zipf S] [--seed S]
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

#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/thread_pool.h"
#include "tools/peer/synthetic_routing.h"

namespace {

namespace fs = std::filesystem;
using tierlm::kernels::f32_to_bf16;

constexpr int64_t kGroup = 64, kBits = 4;
constexpr uint64_t kShardLimit = 5'000'000'000ull;  // mlx-lm's MAX_FILE_SIZE_GB
using tierlm::peer::kMassive;
using tierlm::peer::kOutputScale;
using tierlm::peer::Rng;

struct Shape {
  int64_t vocab = 151936, hidden = 2048, layers = 48, heads = 32, kv_heads = 4, head_dim = 128;
  int64_t experts = 128, top_k = 8, expert_intermediate = 768, dense_intermediate = 6144;
};

// How a quantized tensor's values are made.
enum class Fill : uint8_t {
  random,          // uniform random codes, per-group scale for std 1/sqrt(cols), bias centring them
  random_row0_zero,  // as random, but row 0 of each matrix is exactly 0 (writes nothing to channel 0)
  embedding,       // random, plus kMassive at column 0
  router,          // N(0, 1/sqrt(cols)) plus the popularity column 0 (see the file comment)
};

struct Tensor {
  std::string name;
  std::string dtype;  // "U32", "BF16"
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  // What to write: a quantized Linear part or a norm.
  enum class Part : uint8_t { codes, scales, biases, norm } part = Part::norm;
  Fill fill = Fill::random;
  int64_t matrices = 1, rows = 0, cols = 0;  // of the logical float weight
  int64_t layer = 0;
};

void add_quantized(std::vector<Tensor>& out, const std::string& module, int64_t matrices, int64_t rows, int64_t cols,
                   Fill fill, int64_t layer, bool stacked) {
  std::vector<int64_t> lead = stacked ? std::vector<int64_t>{matrices} : std::vector<int64_t>{};
  auto shape = [&](int64_t last) {
    std::vector<int64_t> s = lead;
    s.push_back(rows);
    s.push_back(last);
    return s;
  };
  const int64_t words = cols * kBits / 32, groups = cols / kGroup;
  Tensor w{module + ".weight", "U32", shape(words), uint64_t(matrices * rows * words) * 4, Tensor::Part::codes, fill,
           matrices, rows, cols, layer};
  Tensor s{module + ".scales", "BF16", shape(groups), uint64_t(matrices * rows * groups) * 2, Tensor::Part::scales,
           fill, matrices, rows, cols, layer};
  Tensor b = s;
  b.name = module + ".biases", b.part = Tensor::Part::biases;
  out.push_back(w), out.push_back(s), out.push_back(b);
}

void add_norm(std::vector<Tensor>& out, const std::string& name, int64_t n) {
  Tensor t{name, "BF16", {n}, uint64_t(n) * 2};
  t.part = Tensor::Part::norm;
  out.push_back(t);
}

std::vector<Tensor> tensors_of(const Shape& s) {
  std::vector<Tensor> t;
  const int64_t H = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim, E = s.experts;
  const int64_t I = s.expert_intermediate;
  add_quantized(t, "model.embed_tokens", 1, s.vocab, H, Fill::embedding, 0, false);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add_norm(t, p + "input_layernorm.weight", H);
    add_norm(t, p + "post_attention_layernorm.weight", H);
    add_quantized(t, p + "self_attn.q_proj", 1, q, H, Fill::random, l, false);
    add_quantized(t, p + "self_attn.k_proj", 1, kv, H, Fill::random, l, false);
    add_quantized(t, p + "self_attn.v_proj", 1, kv, H, Fill::random, l, false);
    add_quantized(t, p + "self_attn.o_proj", 1, H, q, Fill::random_row0_zero, l, false);
    add_norm(t, p + "self_attn.q_norm.weight", s.head_dim);
    add_norm(t, p + "self_attn.k_norm.weight", s.head_dim);
    add_quantized(t, p + "mlp.gate", 1, E, H, Fill::router, l, false);
    add_quantized(t, p + "mlp.switch_mlp.gate_proj", E, I, H, Fill::random, l, true);
    add_quantized(t, p + "mlp.switch_mlp.up_proj", E, I, H, Fill::random, l, true);
    add_quantized(t, p + "mlp.switch_mlp.down_proj", E, H, I, Fill::random_row0_zero, l, true);
  }
  add_norm(t, "model.norm.weight", H);
  add_quantized(t, "lm_head", 1, s.vocab, H, Fill::random, 0, false);
  return t;
}

// MLX affine quantization of one float row (group min/max), bf16 scales and biases; codes packed element 0 lowest.
void quantize_row(const float* x, int64_t cols, uint32_t* codes, uint16_t* scales, uint16_t* biases) {
  for (int64_t g = 0; g < cols / kGroup; ++g) {
    const float* v = x + g * kGroup;
    const auto [lo, hi] = std::minmax_element(v, v + kGroup);
    const uint16_t sb = f32_to_bf16(std::max((*hi - *lo) / 15.0f, 1e-7f)), bb = f32_to_bf16(*lo);
    scales[g] = sb, biases[g] = bb;
    const float scale = tierlm::kernels::bf16_to_f32(sb), bias = tierlm::kernels::bf16_to_f32(bb);
    for (int64_t w = 0; w < kGroup / 8; ++w) {
      uint32_t word = 0;
      for (int j = 0; j < 8; ++j) {
        const int code = std::clamp(int(std::lround((v[w * 8 + j] - bias) / scale)), 0, 15);
        word |= uint32_t(code) << (4 * j);
      }
      codes[g * (kGroup / 8) + w] = word;
    }
  }
}

class Generator {
 public:
  Generator(const Shape& s, double zipf, uint64_t seed) : s_(s), zipf_(zipf), seed_(seed) {}

  // The bytes of one tensor, produced in pieces of whole rows (the stacked experts are ~100 MB a part).
  template <class Sink>
  void produce(const Tensor& t, Sink&& sink) {
    if (t.part == Tensor::Part::norm) {
      Rng rng{seed_ ^ std::hash<std::string>()(t.name)};
      std::vector<uint16_t> v(size_t(t.shape[0]));
      for (auto& x : v) x = f32_to_bf16(1.0f + 0.05f * (rng.uniform() - 0.5f));
      sink(v.data(), v.size() * 2);
      return;
    }
    const int64_t words = t.cols * kBits / 32, groups = t.cols / kGroup, rows = t.matrices * t.rows;
    // Codes, scales and biases of one module come from the same row-seeded generator, so each part is written
    // from an independent pass without holding the others.
    const uint64_t module_seed = seed_ ^ std::hash<std::string>()(t.name.substr(0, t.name.rfind('.')));
    const int64_t chunk_rows = 16384;
    std::vector<uint32_t> codes(size_t(chunk_rows * words));
    std::vector<uint16_t> scales(size_t(chunk_rows * groups)), biases(size_t(chunk_rows * groups));
    // Every row has its own generator (row_values), so the rows of a chunk are made on all cores and the bytes do
    // not depend on the thread count. The router's popularity ranks are the one shared state: made here first.
    if (t.fill == Fill::router && rank_layer_ != t.layer)
      rank_ = tierlm::peer::expert_ranks(seed_, t.layer, s_.experts), rank_layer_ = t.layer;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
        std::vector<float> row(size_t(t.cols));
        for (int64_t i = begin; i < end; ++i)
          row_values(t, r0 + i, module_seed, row, &codes[size_t(i * words)], &scales[size_t(i * groups)],
                     &biases[size_t(i * groups)]);
      });
      if (t.part == Tensor::Part::codes) sink(codes.data(), size_t(n * words) * 4);
      else sink((t.part == Tensor::Part::scales ? scales : biases).data(), size_t(n * groups) * 2);
    }
  }

 private:
  void row_values(const Tensor& t, int64_t r, uint64_t module_seed, std::vector<float>& row, uint32_t* codes,
                  uint16_t* scales, uint16_t* biases) {
    Rng rng{module_seed * 0x100000001B3ull + uint64_t(r)};
    const int64_t words = t.cols * kBits / 32, groups = t.cols / kGroup;
    const int64_t row_in_matrix = r % t.rows;
    if (t.fill == Fill::random_row0_zero && row_in_matrix == 0) {
      std::fill(codes, codes + words, 0u);
      std::fill(scales, scales + groups, uint16_t(0));
      std::fill(biases, biases + groups, uint16_t(0));
      return;
    }
    if (t.fill == Fill::router) {
      router_row(t.layer, row_in_matrix, rng, row);
      quantize_row(row.data(), t.cols, codes, scales, biases);
      return;
    }
    // Uniform codes 0..15 have std 4.61 and mean 7.5: scale ~ target std / 4.61, bias -7.5 scale. The embedding
    // has unit std per channel (so channel 0 carries kMassive^2 / H of the energy); the projections writing the
    // residual (o_proj, expert down_proj) are scaled by kOutputScale so its RMS grows slowly with depth.
    const float target = t.fill == Fill::embedding          ? 1.0f
                         : t.fill == Fill::random_row0_zero ? kOutputScale / std::sqrt(float(t.cols))
                                                            : 1.0f / std::sqrt(float(t.cols));
    for (int64_t w = 0; w < words; w += 2) {
      const uint64_t bits = rng.next();
      codes[w] = uint32_t(bits);
      if (w + 1 < words) codes[w + 1] = uint32_t(bits >> 32);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = target / 4.61f * (0.75f + 0.5f * rng.uniform());
      scales[g] = f32_to_bf16(scale);
      biases[g] = f32_to_bf16(-7.5f * tierlm::kernels::bf16_to_f32(scales[g]));
    }
    if (t.fill == Fill::embedding) {  // group 0 re-quantized with the massive channel at column 0
      const float scale0 = tierlm::kernels::bf16_to_f32(scales[0]), bias0 = tierlm::kernels::bf16_to_f32(biases[0]);
      for (int64_t j = 0; j < kGroup; ++j) row[size_t(j)] = scale0 * float((codes[j / 8] >> (4 * (j % 8))) & 15) + bias0;
      row[0] = kMassive;
      quantize_row(row.data(), kGroup, codes, scales, biases);
    }
  }

  // Router row of expert e: tools/peer/synthetic_routing.h's, with this layer's popularity ranks.
  void router_row(int64_t layer, int64_t e, Rng& rng, std::vector<float>& row) {
    tierlm::peer::router_row(s_.hidden, layer, rank_[size_t(e)], zipf_, rng, row.data());
  }

  Shape s_;
  double zipf_;
  uint64_t seed_;
  int64_t rank_layer_ = -1;
  tierlm::kernels::ThreadPool pool_{0, /*pin=*/false};  // one thread per core; rows are made in parallel
  std::vector<int32_t> rank_;
};

void write_config(const fs::path& dir, const Shape& s) {
  std::ofstream out(dir / "config.json");
  out << fmt::format(R"({{
  "architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe",
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "decoder_sparse_step": 1,
  "head_dim": {},
  "hidden_act": "silu",
  "hidden_size": {},
  "intermediate_size": {},
  "max_position_embeddings": 40960,
  "max_window_layers": {},
  "mlp_only_layers": [],
  "moe_intermediate_size": {},
  "norm_topk_prob": true,
  "num_attention_heads": {},
  "num_experts": {},
  "num_experts_per_tok": {},
  "num_hidden_layers": {},
  "num_key_value_heads": {},
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_sliding_window": false,
  "vocab_size": {},
  "quantization": {{"group_size": {}, "bits": {}}},
  "quantization_config": {{"group_size": {}, "bits": {}}}
}}
)",
                     s.head_dim, s.hidden, s.dense_intermediate, s.layers, s.expert_intermediate, s.heads, s.experts,
                     s.top_k, s.layers, s.kv_heads, s.vocab, kGroup, kBits, kGroup, kBits);
  if (!out) throw std::runtime_error("cannot write " + (dir / "config.json").string());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const tierlm::peer::ToolArgs args = tierlm::peer::parse_tool_args(
        argc, argv, "usage: synthetic_mlx_moe OUT_DIR --tokenizer DIR [--layers N] [--zipf S] [--seed S]",
        {"--tokenizer", "--layers", "--zipf", "--seed"});
    const fs::path& dir = args.dir;
    Shape shape;
    if (args.has("--layers")) shape.layers = std::stoll(args.at("--layers"));
    const double zipf = args.has("--zipf") ? std::stod(args.at("--zipf")) : 0.8;
    const uint64_t seed = args.has("--seed") ? std::stoull(args.at("--seed")) : 1;
    const fs::path tokenizer = args.has("--tokenizer") ? args.at("--tokenizer") : "";
    if (tokenizer.empty() || !fs::exists(tokenizer / "tokenizer.json"))
      throw std::invalid_argument("--tokenizer DIR must hold a Qwen3 tokenizer.json (e.g. .cache/tokenizers/qwen3)");
    fs::create_directories(dir);
    write_config(dir, shape);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (fs::exists(tokenizer / f)) fs::copy_file(tokenizer / f, dir / f, fs::copy_options::overwrite_existing);
    Generator gen(shape, zipf, seed);
    tierlm::peer::write_shards(dir, tensors_of(shape), kShardLimit, "mlx", "synthetic_mlx_moe",
                               [&](const Tensor& t, auto&& sink) { gen.produce(t, sink); });
    std::fprintf(stderr, "synthetic_mlx_moe: wrote %s (%lld layers)\n", dir.c_str(), static_cast<long long>(shape.layers));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_mlx_moe: %s\n", e.what());
    return 1;
  }
}
