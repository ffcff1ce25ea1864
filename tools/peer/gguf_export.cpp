// tools/peer/gguf_export.cpp — writes a dense Llama-architecture Hugging Face folder as a GGUF file (F16, Q8_0,
// Q4_0 or Q4_K) for llama.cpp, reading the weights through tierlm's own safetensors loader, so bench/peer.sh compares
// the two engines on the same values.
// Owns: GGUF v3 serialisation (metadata, tensor infos, 32-byte aligned data), ggml's Q8_0 / Q4_0 block layouts (Q4_K:
// tools/peer/ggml_q4_k.h; a matrix whose rows are not whole 256-value blocks goes out as Q4_0, said on stderr), the
// HF -> llama.cpp tensor names, and the q/k row permutation llama.cpp's rope expects. Written from the GGUF and
// ggml block format descriptions. The vocabulary is a placeholder (the bench feeds token ids, never text).
// Never: export an architecture or option it does not implement (it throws naming it).
//
// From an MLX affine 4-bit Qwen3-MoE folder (tools/peer/synthetic_mlx_moe, or a user's mlx-community folder),
// `--from-mlx` writes Q4_1 with the SAME values: an MLX group of 64 (w = scale * q + bias, bf16 scale and bias) is
// two Q4_1 blocks of 32 (w = d * q + m) with d = scale, m = bias and the same 4-bit codes; bf16 -> f16 is exact for
// normal f16 values (|v| >= 2^-14), so only scales or biases below that lose bits (counted and printed). The router
// and the norms go out as F32 (exact).
//
// Usage: gguf_export HF_DIR OUT.gguf f16|q8_0|q4_0|q4_k
//        gguf_export --from-mlx MLX_DIR OUT.gguf
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/kernels/kernel_isa.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_convert.h"
#include "tools/peer/ggml_q4_k.h"

namespace {

using tierlm::kernels::f32_to_f16;

enum GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = tierlm::tools::kGgmlTypeQ4K };
enum ValueType : uint32_t { kU32 = 4, kI32 = 5, kF32Value = 6, kBool = 7, kString = 8, kArray = 9 };
constexpr uint64_t kAlignment = 32;
constexpr int kBlock = 32;  // Q8_0 and Q4_0 block length

// Bytes of one [rows x cols] tensor in a ggml type.
uint64_t type_bytes(GgmlType t, int64_t elements) {
  switch (t) {
    case kF32: return uint64_t(elements) * 4;
    case kF16: return uint64_t(elements) * 2;
    case kQ8_0: return uint64_t(elements / kBlock) * 34;  // f16 scale + 32 int8
    case kQ4_0: return uint64_t(elements / kBlock) * 18;  // f16 scale + 16 bytes of nibbles
    case kQ4_1: return uint64_t(elements / kBlock) * 20;  // f16 scale, f16 minimum + 16 bytes of nibbles
    case kQ4_K: return uint64_t(elements / tierlm::tools::kQ4KValues) * tierlm::tools::kQ4KBytes;
  }
  return 0;
}

// Q8_0: d = amax / 127, q = round(x / d).
void quantize_q8_0(const float* x, uint8_t* out) {
  float amax = 0;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, inv = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t h = f32_to_f16(d);
  std::memcpy(out, &h, 2);
  for (int i = 0; i < kBlock; ++i) out[2 + i] = uint8_t(int8_t(std::lround(x[i] * inv)));
}

// Q4_0: d = (the value of largest magnitude) / -8, q = clamp(round(x / d) + 8, 0, 15); byte j holds element j in
// the low nibble and element j + 16 in the high one.
void quantize_q4_0(const float* x, uint8_t* out) {
  float extreme = 0;
  for (int i = 0; i < kBlock; ++i)
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  const float d = extreme / -8.0f, inv = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t h = f32_to_f16(d);
  std::memcpy(out, &h, 2);
  auto code = [&](float v) { return uint8_t(std::min(15, int(v * inv + 8.5f))); };
  for (int j = 0; j < kBlock / 2; ++j) out[2 + j] = uint8_t(code(x[j]) | (code(x[j + kBlock / 2]) << 4));
}

std::vector<uint8_t> encode(GgmlType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(type_bytes(t, int64_t(v.size())));
  if (t == kF32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else if (t == kF16) {
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  } else if (t == kQ4_K) {
    for (size_t b = 0; b < v.size() / tierlm::tools::kQ4KValues; ++b)
      tierlm::tools::quantize_q4_k(v.data() + b * tierlm::tools::kQ4KValues, out.data() + b * tierlm::tools::kQ4KBytes);
  } else {
    const size_t block_bytes = t == kQ8_0 ? 34 : 18;
    for (size_t b = 0; b < v.size() / kBlock; ++b)
      (t == kQ8_0 ? quantize_q8_0 : quantize_q4_0)(v.data() + b * kBlock, out.data() + b * block_bytes);
  }
  return out;
}

// HF rotates halves of each head (rotate_half); llama.cpp's "llama" rope rotates adjacent pairs, so the rows of
// q_proj / k_proj are interleaved per head: new row 2i + j of a head is old row j * head_dim / 2 + i.
std::vector<float> permute_heads(const std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < head_dim / 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(&out[size_t((h * head_dim + 2 * i + j) * cols)], &w[size_t((h * head_dim + j * head_dim / 2 + i) * cols)],
                    size_t(cols) * sizeof(float));
  return out;
}

using Producer = std::function<std::vector<uint8_t>()>;

class GgufWriter {
 public:
  void u32(const std::string& key, uint32_t v) { this->key(key, kU32), pod(meta_, v); ++kv_count_; }
  void f32(const std::string& key, float v) { this->key(key, kF32Value), pod(meta_, v); ++kv_count_; }
  void boolean(const std::string& key, bool v) { this->key(key, kBool), pod(meta_, uint8_t(v)); ++kv_count_; }
  void string(const std::string& key, const std::string& v) { this->key(key, kString), str(meta_, v); ++kv_count_; }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    this->key(key, kArray), pod(meta_, uint32_t(kString)), pod(meta_, uint64_t(v.size()));
    for (const auto& s : v) str(meta_, s);
    ++kv_count_;
  }
  template <class T>
  void array(const std::string& key, ValueType type, const std::vector<T>& v) {
    this->key(key, kArray), pod(meta_, uint32_t(type)), pod(meta_, uint64_t(v.size()));
    for (const T& x : v) pod(meta_, x);
    ++kv_count_;
  }
  // dims innermost first (ggml's ne0 = columns). The data is produced at write() time, one tensor at a time, so a
  // model larger than memory streams through.
  void tensor(const std::string& name, std::vector<int64_t> dims, GgmlType type, Producer produce) {
    int64_t elements = 1;
    for (int64_t d : dims) elements *= d;
    const uint64_t bytes = type_bytes(type, elements);
    str(infos_, name);
    pod(infos_, uint32_t(dims.size()));
    for (int64_t d : dims) pod(infos_, uint64_t(d));
    pod(infos_, uint32_t(type));
    pod(infos_, data_size_);
    data_size_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    data_.push_back({name, bytes, std::move(produce)});
  }
  void write(const std::filesystem::path& file) {
    std::ofstream out(file, std::ios::binary);
    std::vector<uint8_t> head;
    head.insert(head.end(), {'G', 'G', 'U', 'F'});
    pod(head, uint32_t(3));
    pod(head, uint64_t(data_.size()));
    pod(head, kv_count_);
    head.insert(head.end(), meta_.begin(), meta_.end());
    head.insert(head.end(), infos_.begin(), infos_.end());
    head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
    out.write(reinterpret_cast<const char*>(head.data()), std::streamsize(head.size()));
    for (auto& d : data_) {
      std::vector<uint8_t> bytes = d.produce();
      if (bytes.size() != d.bytes)
        throw std::logic_error(fmt::format("gguf_export: {} produced {} bytes, expected {}", d.name, bytes.size(), d.bytes));
      bytes.resize((bytes.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
      out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      d.produce = nullptr;
    }
    if (!out) throw std::runtime_error("cannot write " + file.string());
  }

 private:
  template <class T>
  static void pod(std::vector<uint8_t>& out, const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);  // little-endian hosts only
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void str(std::vector<uint8_t>& out, const std::string& s) {
    pod(out, uint64_t(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void key(const std::string& k, ValueType t) { str(meta_, k), pod(meta_, uint32_t(t)); }
  struct Pending {
    std::string name;
    uint64_t bytes;
    Producer produce;
  };
  std::vector<uint8_t> meta_, infos_;
  std::vector<Pending> data_;
  uint64_t kv_count_ = 0, data_size_ = 0;
};

// A SentencePiece-style placeholder vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then distinct pieces.
void write_vocab(GgufWriter& g, int64_t vocab) {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int64_t i = 0; i < vocab; ++i) {
    if (i == 0) tokens.push_back("<unk>"), types.push_back(2);
    else if (i <= 2) tokens.push_back(i == 1 ? "<s>" : "</s>"), types.push_back(3);
    else if (i < 3 + 256) tokens.push_back(fmt::format("<0x{:02X}>", i - 3)), types.push_back(6);
    else tokens.push_back(fmt::format("\xe2\x96\x81t{}", i)), types.push_back(1);
    scores.push_back(-float(i));
  }
  g.string("tokenizer.ggml.model", "llama");
  g.strings("tokenizer.ggml.tokens", tokens);
  g.array("tokenizer.ggml.scores", kF32Value, scores);
  g.array("tokenizer.ggml.token_type", kI32, types);
  g.u32("tokenizer.ggml.unknown_token_id", 0);
  g.u32("tokenizer.ggml.bos_token_id", 1);
  g.u32("tokenizer.ggml.eos_token_id", 2);
  g.boolean("tokenizer.ggml.add_bos_token", false);
}

void export_gguf(const std::filesystem::path& hf, const std::filesystem::path& out, const std::string& type_name) {
  using namespace tierlm::model;
  const ModelConfig c = load_config(hf);
  if (c.model_type != "llama" || c.arch.moe || c.arch.qkv_bias || c.arch.qk_norm)
    throw std::invalid_argument("gguf_export: only dense llama models are implemented (got " + c.model_type + ")");
  if (!c.tie_word_embeddings) throw std::invalid_argument("gguf_export: only tied embeddings are implemented");
  GgmlType matrix_type;
  uint32_t file_type;
  if (type_name == "f16") matrix_type = kF16, file_type = 1;
  else if (type_name == "q8_0") matrix_type = kQ8_0, file_type = 7;
  else if (type_name == "q4_0") matrix_type = kQ4_0, file_type = 2;
  else if (type_name == "q4_k") matrix_type = kQ4_K, file_type = 14;  // llama.cpp's MOSTLY_Q4_K_S: every matrix Q4_K
  else throw std::invalid_argument("gguf_export: unknown type '" + type_name + "' (accepted: f16, q8_0, q4_0, q4_k)");

  const TensorIndex index = TensorIndex::open(hf);
  GgufWriter g;
  g.string("general.architecture", "llama");
  g.string("general.name", "tierlm synthetic " + hf.filename().string());
  g.u32("general.file_type", file_type);
  g.u32("general.alignment", uint32_t(kAlignment));
  g.u32("llama.context_length", uint32_t(c.max_position_embeddings));
  g.u32("llama.embedding_length", uint32_t(c.hidden_size));
  g.u32("llama.block_count", uint32_t(c.num_layers));
  g.u32("llama.feed_forward_length", uint32_t(c.intermediate_size));
  g.u32("llama.attention.head_count", uint32_t(c.num_heads));
  g.u32("llama.attention.head_count_kv", uint32_t(c.num_kv_heads));
  g.u32("llama.attention.key_length", uint32_t(c.head_dim));
  g.u32("llama.attention.value_length", uint32_t(c.head_dim));
  g.u32("llama.rope.dimension_count", uint32_t(c.head_dim));
  g.f32("llama.rope.freq_base", float(c.rope.theta));
  g.f32("llama.attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
  g.u32("llama.vocab_size", uint32_t(c.vocab_size));
  write_vocab(g, c.vocab_size);

  auto load = [&](const std::string& name) { return tensor_to_f32(index, index.at(name)); };
  // The tensors are read and encoded when the writer streams them out (index and config outlive g.write).
  auto matrix = [&](const std::string& gguf_name, const std::string& hf_name, int64_t permute_heads_count) {
    const TensorInfo& t = index.at(hf_name);
    if (t.shape.size() != 2 || t.shape[1] % kBlock != 0)
      throw std::invalid_argument("gguf_export: " + hf_name + " is not a matrix with columns a multiple of 32");
    const int64_t cols = t.shape[1];
    GgmlType type = matrix_type;
    if (type == kQ4_K && cols % tierlm::tools::kQ4KValues != 0) {
      std::fprintf(stderr, "gguf_export: %s has %lld columns, not whole Q4_K blocks of 256: written as Q4_0\n",
                   hf_name.c_str(), (long long)cols);
      type = kQ4_0;
    }
    g.tensor(gguf_name, {cols, t.shape[0]}, type, [&, hf_name, cols, permute_heads_count, type] {
      std::vector<float> v = load(hf_name);
      if (permute_heads_count > 0) v = permute_heads(v, permute_heads_count, c.head_dim, cols);
      return encode(type, v);
    });
  };
  auto vector = [&](const std::string& gguf_name, const std::string& hf_name) {
    const TensorInfo& t = index.at(hf_name);
    g.tensor(gguf_name, {t.shape.at(0)}, kF32, [&, hf_name] { return encode(kF32, load(hf_name)); });
  };
  matrix("token_embd.weight", "model.embed_tokens.weight", 0);
  vector("output_norm.weight", "model.norm.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string hp = fmt::format("model.layers.{}.", l), gp = fmt::format("blk.{}.", l);
    vector(gp + "attn_norm.weight", hp + "input_layernorm.weight");
    matrix(gp + "attn_q.weight", hp + "self_attn.q_proj.weight", c.num_heads);
    matrix(gp + "attn_k.weight", hp + "self_attn.k_proj.weight", c.num_kv_heads);
    matrix(gp + "attn_v.weight", hp + "self_attn.v_proj.weight", 0);
    matrix(gp + "attn_output.weight", hp + "self_attn.o_proj.weight", 0);
    vector(gp + "ffn_norm.weight", hp + "post_attention_layernorm.weight");
    matrix(gp + "ffn_gate.weight", hp + "mlp.gate_proj.weight", 0);
    matrix(gp + "ffn_up.weight", hp + "mlp.up_proj.weight", 0);
    matrix(gp + "ffn_down.weight", hp + "mlp.down_proj.weight", 0);
  }
  g.write(out);
}

// ---- MLX affine 4-bit Qwen3-MoE -> qwen3moe GGUF (Q4_1, same values) ------------------------------------------

uint64_t g_inexact_f16 = 0;  // scales/biases that f16 cannot hold exactly (subnormal or out of range)

uint16_t bf16_to_f16_counted(uint16_t b) {
  const float v = tierlm::kernels::bf16_to_f32(b);
  const uint16_t h = f32_to_f16(v);
  if (tierlm::kernels::f16_to_f32(h) != v) ++g_inexact_f16;
  return h;
}

// An MLX quantized module (weight uint32 [..., rows, cols/8], scales/biases bf16 [..., rows, cols/64]) as Q4_1.
std::vector<uint8_t> mlx_q4_to_q4_1(const tierlm::model::TensorIndex& index, const std::string& module) {
  using tierlm::model::DType;
  const auto& w = index.at(module + ".weight");
  const auto& sc = index.at(module + ".scales");
  const auto& bi = index.at(module + ".biases");
  if (w.dtype != DType::U32 || sc.dtype != DType::BF16 || bi.dtype != DType::BF16)
    throw std::invalid_argument("gguf_export: " + module + " is not MLX 4-bit with bf16 scales and biases");
  const int64_t groups_total = sc.elements(), words_per_group = 8;  // 64 codes of 4 bits = 8 words
  if (w.elements() != groups_total * words_per_group)
    throw std::invalid_argument("gguf_export: " + module + " is not group size 64, 4 bits");
  const auto* codes = reinterpret_cast<const uint32_t*>(index.data(w).data());
  const auto* scales = reinterpret_cast<const uint16_t*>(index.data(sc).data());
  const auto* biases = reinterpret_cast<const uint16_t*>(index.data(bi).data());
  std::vector<uint8_t> out(size_t(groups_total) * 2 * 20);
  for (int64_t g = 0; g < groups_total; ++g) {
    const uint16_t d = bf16_to_f16_counted(scales[g]), m = bf16_to_f16_counted(biases[g]);
    const uint32_t* c = codes + g * words_per_group;
    for (int half = 0; half < 2; ++half) {
      uint8_t* block = out.data() + (g * 2 + half) * 20;
      std::memcpy(block, &d, 2);
      std::memcpy(block + 2, &m, 2);
      auto code = [&](int j) { const int e = half * 32 + j; return uint8_t((c[e / 8] >> (4 * (e % 8))) & 15); };
      for (int j = 0; j < 16; ++j) block[4 + j] = uint8_t(code(j) | (code(j + 16) << 4));
    }
  }
  return out;
}

// The dequantized values of an MLX module as F32 (the router: llama.cpp reads ffn_gate_inp in F32).
std::vector<uint8_t> mlx_q4_to_f32(const tierlm::model::TensorIndex& index, const std::string& module) {
  const auto& w = index.at(module + ".weight");
  const auto& sc = index.at(module + ".scales");
  const auto* codes = reinterpret_cast<const uint32_t*>(index.data(w).data());
  const auto* scales = reinterpret_cast<const uint16_t*>(index.data(sc).data());
  const auto* biases = reinterpret_cast<const uint16_t*>(index.data(index.at(module + ".biases")).data());
  std::vector<float> v(size_t(sc.elements() * 64));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = tierlm::kernels::bf16_to_f32(scales[i / 64]) * float((codes[i / 8] >> (4 * (i % 8))) & 15) +
           tierlm::kernels::bf16_to_f32(biases[i / 64]);
  return encode(kF32, v);
}

void export_qwen3_moe_mlx(const std::filesystem::path& dir, const std::filesystem::path& out) {
  using namespace tierlm::model;
  const ModelConfig c = load_config(dir);
  if (c.model_type != "qwen3_moe" || !c.quantization || c.quantization->bits != 4 || c.quantization->group_size != 64)
    throw std::invalid_argument("gguf_export --from-mlx: only MLX 4-bit group-64 qwen3_moe folders are implemented");
  if (c.tie_word_embeddings) throw std::invalid_argument("gguf_export --from-mlx: tied embeddings not implemented");
  const TensorIndex index = TensorIndex::open(dir);
  GgufWriter g;
  const std::string a = "qwen3moe";
  g.string("general.architecture", a);
  g.string("general.name", "tierlm synthetic " + dir.filename().string());
  g.u32("general.file_type", 3);  // MOSTLY_Q4_1
  g.u32("general.alignment", uint32_t(kAlignment));
  g.u32(a + ".context_length", uint32_t(c.max_position_embeddings));
  g.u32(a + ".embedding_length", uint32_t(c.hidden_size));
  g.u32(a + ".block_count", uint32_t(c.num_layers));
  g.u32(a + ".feed_forward_length", uint32_t(c.intermediate_size));
  g.u32(a + ".expert_feed_forward_length", uint32_t(c.moe_intermediate_size));
  g.u32(a + ".expert_count", uint32_t(c.num_experts));
  g.u32(a + ".expert_used_count", uint32_t(c.num_experts_per_tok));
  g.u32(a + ".attention.head_count", uint32_t(c.num_heads));
  g.u32(a + ".attention.head_count_kv", uint32_t(c.num_kv_heads));
  g.u32(a + ".attention.key_length", uint32_t(c.head_dim));
  g.u32(a + ".attention.value_length", uint32_t(c.head_dim));
  g.f32(a + ".rope.freq_base", float(c.rope.theta));
  g.f32(a + ".attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
  write_vocab(g, c.vocab_size);
  // dims innermost first; a module [rows, cols] (or [experts, rows, cols]) is {cols, rows(, experts)}.
  auto q4 = [&](const std::string& name, const std::string& module, std::vector<int64_t> dims) {
    g.tensor(name, std::move(dims), kQ4_1, [&, module] { return mlx_q4_to_q4_1(index, module); });
  };
  auto norm = [&](const std::string& name, const std::string& tensor) {
    g.tensor(name, {index.at(tensor).shape.at(0)}, kF32, [&, tensor] { return encode(kF32, tensor_to_f32(index, index.at(tensor))); });
  };
  const int64_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  q4("token_embd.weight", "model.embed_tokens", {H, V});
  norm("output_norm.weight", "model.norm.weight");
  q4("output.weight", "lm_head", {H, V});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l), b = fmt::format("blk.{}.", l);
    norm(b + "attn_norm.weight", p + "input_layernorm.weight");
    q4(b + "attn_q.weight", p + "self_attn.q_proj", {H, q});
    q4(b + "attn_k.weight", p + "self_attn.k_proj", {H, kv});
    q4(b + "attn_v.weight", p + "self_attn.v_proj", {H, kv});
    q4(b + "attn_output.weight", p + "self_attn.o_proj", {q, H});
    norm(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight");
    norm(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight");
    norm(b + "ffn_norm.weight", p + "post_attention_layernorm.weight");
    g.tensor(b + "ffn_gate_inp.weight", {H, E}, kF32, [&, p] { return mlx_q4_to_f32(index, p + "mlp.gate"); });
    q4(b + "ffn_gate_exps.weight", p + "mlp.switch_mlp.gate_proj", {H, I, E});
    q4(b + "ffn_up_exps.weight", p + "mlp.switch_mlp.up_proj", {H, I, E});
    q4(b + "ffn_down_exps.weight", p + "mlp.switch_mlp.down_proj", {I, H, E});
  }
  g.write(out);
  std::fprintf(stderr, "gguf_export: %llu scales/biases not exactly representable in f16 (the rest are identical)\n",
               static_cast<unsigned long long>(g_inexact_f16));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 4 && std::string(argv[1]) == "--from-mlx") {
      export_qwen3_moe_mlx(argv[2], argv[3]);
      std::fprintf(stderr, "gguf_export: wrote %s\n", argv[3]);
      return 0;
    }
    if (argc != 4)
      throw std::invalid_argument("usage: gguf_export HF_DIR OUT.gguf f16|q8_0|q4_0|q4_k | gguf_export --from-mlx MLX_DIR OUT.gguf");
    export_gguf(argv[1], argv[2], argv[3]);
    std::fprintf(stderr, "gguf_export: wrote %s\n", argv[2]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_export: %s\n", e.what());
    return 1;
  }
}
