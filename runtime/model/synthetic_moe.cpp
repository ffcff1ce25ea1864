#include "runtime/model/synthetic_moe.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/model/safetensors.h"
#include "tiering/expert_store.h"

namespace tierlm::model {

namespace {

// xorshift64*: fast, deterministic, good enough for random weights.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  float uniform() { return float(next() >> 40) / float(1 << 24) * 2.0f - 1.0f; }  // [-1, 1)
};

uint16_t f16(float v) {  // normal range only, round toward zero: enough for scales
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = int((u >> 23) & 0xff) - 127 + 15;
  if (v == 0.0f || exp <= 0) return uint16_t(sign);
  return uint16_t(sign | uint32_t(exp) << 10 | ((u >> 13) & 0x3ff));
}

void fill_expert(const tiering::ExpertLayout& l, Rng& rng, void* block) {
  auto* base = static_cast<std::byte*>(block);
  for (int m = 0; m < 2; ++m) {
    const int64_t cols = m == 0 ? l.hidden : l.intermediate;
    const float scale = 1.0f / std::sqrt(float(cols));
    const auto& data = l.parts[m * 3], &scales = l.parts[m * 3 + 1], &biases = l.parts[m * 3 + 2];
    if (scales.bytes == 0 && l.format == kernels::WeightFormat::f32) {
      auto* f = reinterpret_cast<float*>(base + data.offset);
      for (uint64_t i = 0; i < data.bytes / 4; ++i) f[i] = rng.uniform() * scale * 1.7f;
      continue;
    }
    if (scales.bytes == 0) throw std::invalid_argument("synthetic MoE: expert format must be f32, q8_0 or q4");
    auto* words = reinterpret_cast<uint64_t*>(base + data.offset);
    for (uint64_t i = 0; i < data.bytes / 8; ++i) words[i] = rng.next();
    // Codes uniform in [0, 2^bits): step d so values span about +-1.7/sqrt(cols); affine formats centre with m.
    const float levels = float((1 << l.bits) - 1);
    const float d = 3.4f * scale / levels;
    auto* s = reinterpret_cast<uint16_t*>(base + scales.offset);
    for (uint64_t i = 0; i < scales.bytes / 2; ++i) s[i] = f16(d);
    if (biases.bytes) {
      auto* b = reinterpret_cast<uint16_t*>(base + biases.offset);
      for (uint64_t i = 0; i < biases.bytes / 2; ++i) b[i] = f16(-d * levels / 2);
    }
  }
}

// A minimal safetensors writer for f32 tensors.
struct TensorFile {
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  std::vector<Entry> entries;
  void add(std::string name, std::vector<int64_t> shape, std::vector<float> data) {
    entries.push_back({std::move(name), std::move(shape), std::move(data)});
  }
  void write(const std::filesystem::path& path) const {
    boost::json::object header;
    uint64_t offset = 0;
    for (const Entry& e : entries) {
      boost::json::array shape;
      for (int64_t d : e.shape) shape.push_back(d);
      const uint64_t bytes = e.data.size() * 4;
      header[e.name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    std::string text = boost::json::serialize(header);
    while (text.size() % 8) text += ' ';
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const Entry& e : entries) out.write(reinterpret_cast<const char*>(e.data.data()), std::streamsize(e.data.size() * 4));
    if (!out) throw ModelError(fmt::format("{}: write failed", path.string()));
  }
};

std::vector<float> random_matrix(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> v(size_t(rows * cols));
  const float scale = 1.7f / std::sqrt(float(cols));
  for (float& x : v) x = rng.uniform() * scale;
  return v;
}

tiering::ExpertLayout layout_of(const SyntheticMoeSpec& s) {
  return tiering::ExpertLayout::make(s.expert_format, s.hidden, s.expert_intermediate);
}

}  // namespace

uint64_t synthetic_moe_expert_bytes(const SyntheticMoeSpec& s) {
  return tiering::kPackedHeaderBytes + uint64_t(s.layers * s.experts) * layout_of(s).bytes;
}

void write_synthetic_moe(const std::filesystem::path& dir, const SyntheticMoeSpec& s,
                         const std::function<void(size_t, size_t)>& progress) {
  std::filesystem::create_directories(dir);
  boost::json::object config{{"model_type", "qwen3_moe"},
                             {"vocab_size", s.vocab},
                             {"hidden_size", s.hidden},
                             {"intermediate_size", s.expert_intermediate},
                             {"moe_intermediate_size", s.expert_intermediate},
                             {"num_hidden_layers", s.layers},
                             {"num_attention_heads", s.heads},
                             {"num_key_value_heads", s.kv_heads},
                             {"head_dim", s.head_dim},
                             {"num_experts", s.experts},
                             {"num_experts_per_tok", s.top_k},
                             {"norm_topk_prob", true},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 1000000.0},
                             {"max_position_embeddings", 4096},
                             {"tie_word_embeddings", false},
                             {"bos_token_id", 1},
                             {"eos_token_id", 2}};
  std::ofstream(dir / "config.json") << boost::json::serialize(config);

  Rng rng(s.seed);
  TensorFile f;
  const int64_t H = s.hidden, q_rows = s.heads * s.head_dim, kv_rows = s.kv_heads * s.head_dim;
  f.add("model.embed_tokens.weight", {s.vocab, H}, random_matrix(rng, s.vocab, H));
  f.add("model.norm.weight", {H}, std::vector<float>(size_t(H), 1.0f));
  f.add("lm_head.weight", {s.vocab, H}, random_matrix(rng, s.vocab, H));
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    f.add(p + "self_attn.q_proj.weight", {q_rows, H}, random_matrix(rng, q_rows, H));
    f.add(p + "self_attn.k_proj.weight", {kv_rows, H}, random_matrix(rng, kv_rows, H));
    f.add(p + "self_attn.v_proj.weight", {kv_rows, H}, random_matrix(rng, kv_rows, H));
    f.add(p + "self_attn.o_proj.weight", {H, q_rows}, random_matrix(rng, H, q_rows));
    f.add(p + "self_attn.q_norm.weight", {s.head_dim}, std::vector<float>(size_t(s.head_dim), 1.0f));
    f.add(p + "self_attn.k_norm.weight", {s.head_dim}, std::vector<float>(size_t(s.head_dim), 1.0f));
    f.add(p + "input_layernorm.weight", {H}, std::vector<float>(size_t(H), 1.0f));
    f.add(p + "post_attention_layernorm.weight", {H}, std::vector<float>(size_t(H), 1.0f));
    // A stronger router than 1/sqrt(H) so routing is decisive (top-k not decided by rounding noise).
    auto router = random_matrix(rng, s.experts, H);
    for (float& x : router) x *= 8.0f;
    f.add(p + "mlp.gate.weight", {s.experts, H}, std::move(router));
  }
  f.write(dir / "model.safetensors");

  const tiering::PackedHeader header{s.layers, s.experts, layout_of(s)};
  tiering::write_packed_experts(
      dir / "experts.tierlm", header,
      [&](int64_t layer, int64_t expert, void* block) {
        Rng expert_rng(s.seed * 1000003ull + uint64_t(layer * s.experts + expert));
        fill_expert(header.layout, expert_rng, block);
      },
      progress);
}

}  // namespace tierlm::model
