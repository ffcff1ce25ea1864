// tools/peer/synthetic_mlx_headline.cpp — writes a random-weight model folder in the mlx-community affine 4-bit
// layout with the real tensor names and shapes of the seed's headline models (issue 15, "Real shapes on small RAM"):
//   gemma4-26b-a4b     Gemma-4-26B-A4B text model: 30 layers (5 sliding : 1 full, window 1024), 16 heads, 8 KV
//                      heads of 256 on sliding layers, 2 KV heads of 512 with k_eq_v (no v_proj) on full layers,
//                      dense GeGLU MLP 2112 beside 128 experts (top-8) of 704, router.proj at 8 bits, tied
//                      embeddings, vocab 262144 (profiles/fit-configs/gemma-4-26b-a4b; ~14 GB)
//   qwen3.5-122b-a10b  Qwen3.5-122B-A10B: hidden 3072, 3 Gated DeltaNet : 1 gated full-attention layers, 32 q heads /
//                      2 KV heads of 256, DeltaNet 16 key heads x 128 / 64 value heads x 128, conv 4, 256 experts
//                      (top-8) of 1024 + a shared expert of 1024, mlp.gate / shared_expert_gate at 8 bits, vocab 248320
//                      (profiles/fit-configs/qwen3.5-122b-a10b-mlx-4bit; --layers N keeps the first N of the 48)
// Names, shapes, dtypes and which modules are quantized follow /work/shared/reference/mlx-layouts.md (mlx-lm's
// sanitized names: `language_model.model.…`, stacked `switch_glu` / `switch_mlp` experts, conv1d [C, K, 1], norms
// stored as applied, no `mtp.*`). Shards of at most 5 GB (`model-0000i-of-0000n.safetensors`, metadata
// {"format": "mlx"}) and `model.safetensors.index.json`, as mlx-lm's save_model writes them.
// Weights: every 4-bit (8-bit) code uniform, scale s = 1 / (sqrt(in) * 4.6) (73.9 at 8 bits) and bias -7.5 s
// (-127.5 s), so each dequantized weight has mean 0 and standard deviation ~1/sqrt(in); norms and scalars 1.
// Owns: the two shapes and a deterministic, fast generator. Never: write outside the folder it is given (the
// tokenizer files are copied from --tokenizer DIR).
//
// Usage: synthetic_mlx_headline OUT_DIR --model gemma4-26b-a4b|qwen3.5-122b-a10b [--layers N] [--tokenizer DIR]
//                               [--seed S]     (prints the bytes written to stdout)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxShardBytes = 5'000'000'000ull;  // mlx-lm MAX_FILE_SIZE_GB = 5
constexpr int64_t kGroup = 64;

enum class Fill : uint8_t { codes, scales, biases, one, normal, a_log };

struct Tensor {
  std::string name, dtype;  // "U32", "BF16", "F32"
  std::vector<int64_t> shape;
  Fill fill;
  int bits = 4;   // codes / scales / biases: the quantization they belong to
  int64_t in = 0;  // the logical input width (scale of the weights)
  uint64_t bytes() const {
    uint64_t n = dtype == "BF16" ? 2 : 4;
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
  }
};

struct Model {
  std::string config;               // config.json
  std::vector<Tensor> tensors;
  std::vector<std::string> quantized_8bit;  // module paths recorded in "quantization"
};

// One MLX QuantizedLinear / QuantizedEmbedding / QuantizedSwitchLinear: [..., out, in] -> weight + scales + biases.
void quantized(Model& m, const std::string& path, std::vector<int64_t> shape, int bits = 4) {
  const int64_t in = shape.back();
  if (in % kGroup) throw std::logic_error(path + ": input width not a multiple of the group");
  auto words = shape, groups = shape;
  words.back() = in * bits / 32;
  groups.back() = in / kGroup;
  m.tensors.push_back({path + ".weight", "U32", words, Fill::codes, bits, in});
  m.tensors.push_back({path + ".scales", "BF16", groups, Fill::scales, bits, in});
  m.tensors.push_back({path + ".biases", "BF16", groups, Fill::biases, bits, in});
  if (bits != 4) m.quantized_8bit.push_back(path);
}
void plain(Model& m, const std::string& name, std::vector<int64_t> shape, Fill fill = Fill::one,
           const std::string& dtype = "BF16") {
  m.tensors.push_back({name, dtype, shape, fill, 0, shape.back()});
}

std::string quantization_json(const Model& m) {
  std::string q = fmt::format(R"({{"group_size": {}, "bits": 4, "mode": "affine")", kGroup);
  for (const auto& p : m.quantized_8bit) q += fmt::format(R"(, "{}": {{"group_size": {}, "bits": 8}})", p, kGroup);
  return q + "}";
}

std::string layer_types_json(const std::vector<std::string>& types) {
  std::string s = "[";
  for (size_t i = 0; i < types.size(); ++i) s += (i ? ", \"" : "\"") + types[i] + "\"";
  return s + "]";
}

Model gemma4_26b_a4b(int64_t layers) {
  const int64_t H = 2816, V = 262144, I = 2112, E = 128, Im = 704, heads = 16, kv = 8, hd = 256, gkv = 2, ghd = 512;
  if (layers <= 0) layers = 30;
  Model m;
  std::vector<std::string> types;
  const std::string P = "language_model.model.";
  quantized(m, P + "embed_tokens", {V, H});
  plain(m, P + "norm.weight", {H});
  for (int64_t l = 0; l < layers; ++l) {
    const bool full = l % 6 == 5;
    types.push_back(full ? "full_attention" : "sliding_attention");
    const std::string p = fmt::format("{}layers.{}.", P, l);
    const int64_t d = full ? ghd : hd, k = full ? gkv : kv;
    quantized(m, p + "self_attn.q_proj", {heads * d, H});
    quantized(m, p + "self_attn.k_proj", {k * d, H});
    if (!full) quantized(m, p + "self_attn.v_proj", {k * d, H});  // attention_k_eq_v: full layers reuse the keys
    quantized(m, p + "self_attn.o_proj", {H, heads * d});
    plain(m, p + "self_attn.q_norm.weight", {d});
    plain(m, p + "self_attn.k_norm.weight", {d});
    quantized(m, p + "mlp.gate_proj", {I, H});
    quantized(m, p + "mlp.up_proj", {I, H});
    quantized(m, p + "mlp.down_proj", {H, I});
    quantized(m, p + "router.proj", {E, H}, 8);
    plain(m, p + "router.scale", {H});
    plain(m, p + "router.per_expert_scale", {E});
    quantized(m, p + "experts.switch_glu.gate_proj", {E, Im, H});
    quantized(m, p + "experts.switch_glu.up_proj", {E, Im, H});
    quantized(m, p + "experts.switch_glu.down_proj", {E, H, Im});
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                          "post_feedforward_layernorm_2"})
      plain(m, p + n + ".weight", {H});
    plain(m, p + "layer_scalar", {1});
  }
  const std::string q = quantization_json(m);
  m.config = fmt::format(R"({{
  "architectures": ["Gemma4ForConditionalGeneration"],
  "model_type": "gemma4",
  "vocab_size": {V},
  "tie_word_embeddings": true,
  "text_config": {{
    "model_type": "gemma4_text",
    "vocab_size": {V},
    "hidden_size": {H},
    "intermediate_size": {I},
    "num_hidden_layers": {L},
    "num_attention_heads": {heads},
    "num_key_value_heads": {kv},
    "num_global_key_value_heads": {gkv},
    "head_dim": {hd},
    "global_head_dim": {ghd},
    "attention_k_eq_v": true,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": {V},
    "use_double_wide_mlp": false,
    "enable_moe_block": true,
    "num_experts": {E},
    "moe_intermediate_size": {Im},
    "top_k_experts": 8,
    "sliding_window": 1024,
    "layer_types": {types},
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 262144,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": true,
    "attention_bias": false,
    "use_bidirectional_attention": null,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "rope_parameters": {{
      "full_attention": {{"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25}},
      "sliding_attention": {{"rope_type": "default", "rope_theta": 10000.0}}
    }}
  }},
  "quantization": {q},
  "quantization_config": {q}
}}
)",
                         fmt::arg("V", V), fmt::arg("H", H), fmt::arg("I", I), fmt::arg("L", layers),
                         fmt::arg("heads", heads), fmt::arg("kv", kv), fmt::arg("gkv", gkv), fmt::arg("hd", hd),
                         fmt::arg("ghd", ghd), fmt::arg("E", E), fmt::arg("Im", Im),
                         fmt::arg("types", layer_types_json(types)), fmt::arg("q", q));
  return m;
}

Model qwen35_122b_a10b(int64_t layers) {
  const int64_t H = 3072, V = 248320, E = 256, Im = 1024, Is = 1024, heads = 32, kv = 2, hd = 256;
  const int64_t nk = 16, dk = 128, nv = 64, dv = 128, K = 4, C = 2 * nk * dk + nv * dv;
  if (layers <= 0) layers = 48;
  Model m;
  std::vector<std::string> types;
  const std::string P = "language_model.model.";
  quantized(m, P + "embed_tokens", {V, H});
  quantized(m, "language_model.lm_head", {V, H});
  plain(m, P + "norm.weight", {H});
  for (int64_t l = 0; l < layers; ++l) {
    const bool full = (l + 1) % 4 == 0;  // full_attention_interval 4
    types.push_back(full ? "full_attention" : "linear_attention");
    const std::string p = fmt::format("{}layers.{}.", P, l);
    if (full) {
      quantized(m, p + "self_attn.q_proj", {2 * heads * hd, H});  // query and output gate per head
      quantized(m, p + "self_attn.k_proj", {kv * hd, H});
      quantized(m, p + "self_attn.v_proj", {kv * hd, H});
      quantized(m, p + "self_attn.o_proj", {H, heads * hd});
      plain(m, p + "self_attn.q_norm.weight", {hd});
      plain(m, p + "self_attn.k_norm.weight", {hd});
    } else {
      quantized(m, p + "linear_attn.in_proj_qkv", {C, H});
      quantized(m, p + "linear_attn.in_proj_z", {nv * dv, H});
      quantized(m, p + "linear_attn.in_proj_b", {nv, H});
      quantized(m, p + "linear_attn.in_proj_a", {nv, H});
      plain(m, p + "linear_attn.conv1d.weight", {C, K, 1}, Fill::normal);
      plain(m, p + "linear_attn.dt_bias", {nv});
      plain(m, p + "linear_attn.A_log", {nv}, Fill::a_log, "F32");
      plain(m, p + "linear_attn.norm.weight", {dv});
      quantized(m, p + "linear_attn.out_proj", {H, nv * dv});
    }
    quantized(m, p + "mlp.gate", {E, H}, 8);
    quantized(m, p + "mlp.switch_mlp.gate_proj", {E, Im, H});
    quantized(m, p + "mlp.switch_mlp.up_proj", {E, Im, H});
    quantized(m, p + "mlp.switch_mlp.down_proj", {E, H, Im});
    quantized(m, p + "mlp.shared_expert.gate_proj", {Is, H});
    quantized(m, p + "mlp.shared_expert.up_proj", {Is, H});
    quantized(m, p + "mlp.shared_expert.down_proj", {H, Is});
    quantized(m, p + "mlp.shared_expert_gate", {1, H}, 8);
    plain(m, p + "input_layernorm.weight", {H});
    plain(m, p + "post_attention_layernorm.weight", {H});
  }
  const std::string q = quantization_json(m);
  m.config = fmt::format(R"({{
  "architectures": ["Qwen3_5MoeForConditionalGeneration"],
  "model_type": "qwen3_5_moe",
  "tie_word_embeddings": false,
  "text_config": {{
    "model_type": "qwen3_5_moe_text",
    "vocab_size": {V},
    "hidden_size": {H},
    "num_hidden_layers": {L},
    "num_attention_heads": {heads},
    "num_key_value_heads": {kv},
    "head_dim": {hd},
    "linear_conv_kernel_dim": {K},
    "linear_num_key_heads": {nk},
    "linear_key_head_dim": {dk},
    "linear_num_value_heads": {nv},
    "linear_value_head_dim": {dv},
    "full_attention_interval": 4,
    "layer_types": {types},
    "num_experts": {E},
    "num_experts_per_tok": 8,
    "moe_intermediate_size": {Im},
    "shared_expert_intermediate_size": {Is},
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": false,
    "tie_word_embeddings": false,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "rope_parameters": {{"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_interleaved": true, "mrope_section": [11, 11, 10]}}
  }},
  "quantization": {q},
  "quantization_config": {q}
}}
)",
                         fmt::arg("V", V), fmt::arg("H", H), fmt::arg("L", layers), fmt::arg("heads", heads),
                         fmt::arg("kv", kv), fmt::arg("hd", hd), fmt::arg("K", K), fmt::arg("nk", nk),
                         fmt::arg("dk", dk), fmt::arg("nv", nv), fmt::arg("dv", dv), fmt::arg("E", E),
                         fmt::arg("Im", Im), fmt::arg("Is", Is), fmt::arg("types", layer_types_json(types)),
                         fmt::arg("q", q));
  return m;
}

uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
}

struct Rng {
  uint64_t s;
  uint64_t next() {  // xorshift64*
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

// Writes t's data to out (little-endian host).
void write_tensor(std::ofstream& out, const Tensor& t, Rng& rng, std::vector<uint8_t>& buffer) {
  const uint64_t total = t.bytes();
  const float levels = t.bits == 8 ? 255.0f : 15.0f, spread = t.bits == 8 ? 73.9f : 4.6f;
  const float scale = 1.0f / (std::sqrt(float(t.in)) * spread);
  uint64_t done = 0;
  while (done < total) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), total - done);
    uint8_t* b = buffer.data();
    switch (t.fill) {
      case Fill::codes:
        for (uint64_t i = 0; i < n; i += 8) {
          const uint64_t r = rng.next();
          std::memcpy(b + i, &r, std::min<uint64_t>(8, n - i));
        }
        break;
      case Fill::scales:
      case Fill::biases:
      case Fill::one:
      case Fill::normal: {
        for (uint64_t i = 0; i < n; i += 2) {
          float v = 1.0f;
          if (t.fill == Fill::scales) v = scale;
          if (t.fill == Fill::biases) v = -0.5f * levels * scale;
          if (t.fill == Fill::normal) v = (float(rng.next() >> 40) / float(1 << 24) - 0.5f) * 3.46f / std::sqrt(float(t.in));
          const uint16_t h = bf16(v);
          std::memcpy(b + i, &h, 2);
        }
        break;
      }
      case Fill::a_log:  // F32 log(A), A in 1..16 as transformers initialises it
        for (uint64_t i = 0; i < n; i += 4) {
          const float v = std::log(1.0f + float((done + i) / 4 % 16));
          std::memcpy(b + i, &v, 4);
        }
        break;
    }
    out.write(reinterpret_cast<const char*>(b), std::streamsize(n));
    done += n;
  }
}

uint64_t write_folder(const fs::path& dir, const Model& m, uint64_t seed) {
  // Shards in tensor order, each at most kMaxShardBytes of data.
  std::vector<std::vector<const Tensor*>> shards(1);
  uint64_t shard_bytes = 0;
  for (const auto& t : m.tensors) {
    if (shard_bytes > 0 && shard_bytes + t.bytes() > kMaxShardBytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += t.bytes();
  }
  const size_t n = shards.size();
  std::string weight_map;
  uint64_t total = 0;
  Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
  std::vector<uint8_t> buffer(size_t(64) << 20);
  for (size_t s = 0; s < n; ++s) {
    const std::string file = n == 1 ? "model.safetensors" : fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, n);
    std::string header = R"({"__metadata__":{"format":"mlx"})";
    uint64_t offset = 0;
    for (const Tensor* t : shards[s]) {
      std::string dims;
      for (int64_t d : t->shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
      header += fmt::format(R"(,"{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t->name, t->dtype, dims,
                            offset, offset + t->bytes());
      offset += t->bytes();
      weight_map += fmt::format(R"({}"{}": "{}")", weight_map.empty() ? "" : ", ", t->name, file);
    }
    header += "}";
    while (header.size() % 8) header += ' ';
    std::ofstream out(dir / file, std::ios::binary);
    const uint64_t header_size = header.size();
    out.write(reinterpret_cast<const char*>(&header_size), 8);
    out.write(header.data(), std::streamsize(header.size()));
    for (const Tensor* t : shards[s]) write_tensor(out, *t, rng, buffer);
    out.close();
    if (!out) throw std::runtime_error("cannot write " + (dir / file).string());
    total += offset;
    std::fprintf(stderr, "synthetic_mlx_headline: %s (%.2f GB)\n", file.c_str(), double(offset) / 1e9);
  }
  std::ofstream index(dir / "model.safetensors.index.json");
  index << fmt::format(R"({{"metadata": {{"total_size": {}}}, "weight_map": {{{}}}}})", total, weight_map) << "\n";
  std::ofstream config(dir / "config.json");
  config << m.config;
  if (!index || !config) throw std::runtime_error("cannot write config.json / index in " + dir.string());
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2)
      throw std::invalid_argument(
          "usage: synthetic_mlx_headline OUT_DIR --model gemma4-26b-a4b|qwen3.5-122b-a10b [--layers N] "
          "[--tokenizer DIR] [--seed S]");
    const fs::path dir = argv[1];
    std::string model, tokenizer;
    int64_t layers = 0;
    uint64_t seed = 1;
    for (int i = 2; i < argc; i += 2) {
      const std::string key = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument("missing value for " + key);
      const std::string value = argv[i + 1];
      if (key == "--model") model = value;
      else if (key == "--layers") layers = std::stoll(value);
      else if (key == "--tokenizer") tokenizer = value;
      else if (key == "--seed") seed = std::stoull(value);
      else throw std::invalid_argument("unknown option " + key);
    }
    Model m;
    if (model == "gemma4-26b-a4b") m = gemma4_26b_a4b(layers);
    else if (model == "qwen3.5-122b-a10b") m = qwen35_122b_a10b(layers);
    else throw std::invalid_argument("--model must be gemma4-26b-a4b or qwen3.5-122b-a10b, got '" + model + "'");
    fs::create_directories(dir);
    const uint64_t bytes = write_folder(dir, m, seed);
    if (!tokenizer.empty())
      for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        if (fs::exists(fs::path(tokenizer) / f))
          fs::copy_file(fs::path(tokenizer) / f, dir / f, fs::copy_options::overwrite_existing);
    std::printf("%llu\n", static_cast<unsigned long long>(bytes));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_mlx_headline: %s\n", e.what());
    return 1;
  }
}
