// tools/peer/synthetic_hf.cpp — writes a random-weight Llama-shaped model as a Hugging Face folder (config.json +
// one f16 model.safetensors), the common source of tierlm's and llama.cpp's weights in bench/peer.sh.
// Owns: the shapes the peer bench runs (1b, 8b) and a deterministic, cheap weight generator.
// Never: write anything but the folder it is given.
//
// Usage: synthetic_hf OUT_DIR [--shape 1b|8b] [--layers N] [--seed S]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/kernels/kernel_isa.h"

namespace {

struct Shape {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;
  double rope_theta;
};

Shape shape_named(const std::string& name) {
  if (name == "1b") return {128256, 2048, 8192, 16, 32, 8, 64, 500000.0};
  if (name == "8b") return {128256, 4096, 14336, 32, 32, 8, 128, 500000.0};
  throw std::invalid_argument("unknown --shape '" + name + "' (accepted: 1b, 8b)");
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool norm;  // 1 + small noise instead of N(0, 1/sqrt(cols))
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

std::vector<Tensor> tensors_of(const Shape& s) {
  std::vector<Tensor> t;
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  t.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}, false});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    t.push_back({p + "input_layernorm.weight", {s.hidden}, true});
    t.push_back({p + "self_attn.q_proj.weight", {q, s.hidden}, false});
    t.push_back({p + "self_attn.k_proj.weight", {kv, s.hidden}, false});
    t.push_back({p + "self_attn.v_proj.weight", {kv, s.hidden}, false});
    t.push_back({p + "self_attn.o_proj.weight", {s.hidden, q}, false});
    t.push_back({p + "post_attention_layernorm.weight", {s.hidden}, true});
    t.push_back({p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, false});
    t.push_back({p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, false});
    t.push_back({p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, false});
  }
  t.push_back({"model.norm.weight", {s.hidden}, true});
  return t;
}

void write_config(const std::filesystem::path& dir, const Shape& s) {
  std::ofstream out(dir / "config.json");
  out << fmt::format(R"({{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": {},
  "hidden_size": {},
  "intermediate_size": {},
  "num_hidden_layers": {},
  "num_attention_heads": {},
  "num_key_value_heads": {},
  "head_dim": {},
  "hidden_act": "silu",
  "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05,
  "rope_theta": {:.1f},
  "tie_word_embeddings": true,
  "torch_dtype": "float16",
  "bos_token_id": 1,
  "eos_token_id": 2
}}
)",
                     s.vocab, s.hidden, s.intermediate, s.layers, s.heads, s.kv_heads, s.head_dim, s.rope_theta);
  if (!out) throw std::runtime_error("cannot write " + (dir / "config.json").string());
}

void write_safetensors(const std::filesystem::path& file, const std::vector<Tensor>& tensors, uint64_t seed) {
  std::string header = "{";
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = uint64_t(t.elements()) * 2;
    std::string dims;
    for (int64_t d : t.shape) {
      if (!dims.empty()) dims += ',';
      dims += std::to_string(d);
    }
    header += fmt::format(R"({}"{}":{{"dtype":"F16","shape":[{}],"data_offsets":[{},{}]}})",
                          header.size() > 1 ? "," : "", t.name, dims, offset, offset + bytes);
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::ofstream out(file, std::ios::binary);
  const uint64_t header_size = header.size();
  out.write(reinterpret_cast<const char*>(&header_size), 8);  // little-endian hosts only (x86-64, aarch64)
  out.write(header.data(), std::streamsize(header.size()));
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> buffer;
  for (const auto& t : tensors) {
    buffer.resize(size_t(t.elements()));
    const int64_t cols = t.shape.back();
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(cols)));
    // One normal draw per 64 values, signs and scales from the bits of another: ~8 G values in seconds.
    for (size_t i = 0; i < buffer.size(); i += 64) {
      const float base = normal(rng);
      const uint64_t bits = rng();
      for (size_t j = 0; j < 64 && i + j < buffer.size(); ++j) {
        const float v = t.norm ? 1.0f + 0.0625f * float(int((bits >> j) & 7) - 4)
                               : base * (((bits >> j) & 1) ? 1.0f : -0.5f) + 0.01f * float(int(j % 7) - 3) * base;
        buffer[i + j] = tierlm::kernels::f32_to_f16(v);
      }
    }
    out.write(reinterpret_cast<const char*>(buffer.data()), std::streamsize(buffer.size() * 2));
  }
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw std::invalid_argument("usage: synthetic_hf OUT_DIR [--shape 1b|8b] [--layers N] [--seed S]");
    std::filesystem::path dir = argv[1];
    Shape shape = shape_named("1b");
    uint64_t seed = 1;
    int64_t layers = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string key = argv[i], value = argv[i + 1];
      if (key == "--shape") shape = shape_named(value);
      else if (key == "--layers") layers = std::stoll(value);
      else if (key == "--seed") seed = std::stoull(value);
      else throw std::invalid_argument("unknown option " + key);
    }
    if (layers > 0) shape.layers = layers;
    std::filesystem::create_directories(dir);
    write_config(dir, shape);
    write_safetensors(dir / "model.safetensors", tensors_of(shape), seed);
    std::fprintf(stderr, "synthetic_hf: wrote %s (%lld layers)\n", dir.c_str(), static_cast<long long>(shape.layers));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_hf: %s\n", e.what());
    return 1;
  }
}
