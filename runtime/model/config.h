// runtime/model/config.h — a model's config.json as a typed ModelConfig, plus the architecture table that says, as
// data, how each supported model_type's block is built (which tensors, which attention/MLP variant).
// Never: guess silently. Unknown architectures and unsupported options are load-time errors naming the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tierlm::model {

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct QuantizationConfig {  // MLX affine quantization ("quantization": {"group_size", "bits"})
  int group_size = 0;
  int bits = 0;
};

// The per-architecture description: how the block differs between families.
struct ArchitectureSpec {
  std::string model_type;
  bool qkv_bias = false;        // q/k/v projections carry a bias (qwen2)
  bool qk_norm = false;         // RMSNorm over head_dim of q and k before RoPE (qwen3)
  bool moe = false;             // sparse MLP (handled by the MoE tier)
  // MoE variants (only read when moe):
  bool qk_norm_full_width = false;  // q/k norm weights span the whole projection, not one head (olmoe)
  bool moe_renormalize = false;     // top-k weights always renormalized to sum 1 (mixtral), else norm_topk_prob
  bool shared_expert = false;       // + sigmoid(shared_expert_gate . x) * shared MLP(x) (qwen2_moe)
  const char* moe_block = "mlp";    // module holding the router ("gate") and "experts"
  const char* expert_gate = "gate_proj";  // per-expert tensor names (mixtral: w1 / w3 / w2)
  const char* expert_up = "up_proj";
  const char* expert_down = "down_proj";
};

struct ModelConfig {
  std::string model_type;
  ArchitectureSpec arch;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype;
  std::optional<QuantizationConfig> quantization;
  // MoE (qwen3_moe, mixtral, olmoe, qwen2_moe); zero for dense models.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;
};

// Parses DIR/config.json; throws ModelError naming the file and field on anything missing, mistyped or unsupported.
ModelConfig load_config(const std::filesystem::path& model_dir);
ModelConfig parse_config(const std::string& json_text, const std::string& origin);

// The table of supported architectures; nullptr when model_type is unknown.
const ArchitectureSpec* find_architecture(const std::string& model_type);
std::vector<std::string> supported_architectures();

}  // namespace tierlm::model
