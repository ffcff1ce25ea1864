#include "runtime/model/config_keys.h"

#include <algorithm>
#include <set>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/model/safetensors.h"

namespace tierlm::model {

namespace json = boost::json;

namespace {

// Read by every family (config.cpp's parse_config).
const char* const kCommon[] = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters",
    "rope_scaling", "tie_word_embeddings", "hidden_act", "bos_token_id", "eos_token_id", "quantization",
    "quantization_config", "torch_dtype", "dtype", "text_config"};

const char* const kBookkeeping[] = {
    "_name_or_path", "architectures", "auto_map", "transformers_version", "use_cache", "initializer_range",
    "attention_dropout", "hidden_dropout", "chunk_size_feed_forward", "id2label", "label2id", "is_encoder_decoder",
    "output_attentions", "output_hidden_states", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "pad_token_id", "problem_type", "return_dict", "tokenizer_class", "pretraining_tp",
    "torchscript", "use_return_dict", "task_specific_params", "prefix", "sep_token_id", "decoder_start_token_id",
    // DeepSeek's training-only keys (auxiliary loss, expert parallelism).
    "aux_loss_alpha", "seq_aux", "ep_size"};

// The wrapper of a multimodal checkpoint (Gemma4ForConditionalGeneration): its towers' configs and media token ids,
// beside the text_config tierlm reads; the towers' tensors are never loaded.
const char* const kTowerKeys[] = {"vision_config",  "audio_config",  "image_token_id", "audio_token_id",
                                  "video_token_id", "boi_token_id",  "eoi_token_id",   "boa_token_id",
                                  "eoa_token_id",   "eoa_token_index"};

// Math keys no family implements yet, with their neutral values (null always counts as neutral).
struct Refused {
  const char* key;
  double neutral;    // a number equal to it is neutral
  bool zero_or_false;  // 0 / false / empty list also neutral
};
const Refused kRefused[] = {
    {"partial_rotary_factor", 1.0, false}, {"attn_logit_softcapping", 0, false},
    {"final_logit_softcapping", 0, false}, {"logit_softcapping", 0, false},
    {"clip_qkv", 0, false},                {"embedding_multiplier", 1.0, false},
    {"residual_multiplier", 1.0, false},   {"attention_multiplier", 1.0, false},
    {"logits_scaling", 1.0, false},        {"logit_scale", 1.0, false},
    {"query_pre_attn_scalar", 0, false},   {"use_qk_norm", 0, true},
    {"attention_chunk_size", 0, false},    {"no_rope_layers", 0, true},
    {"first_k_dense_replace", 0, true},    {"kv_lora_rank", 0, true},
    {"q_lora_rank", 0, true},              {"n_shared_experts", 0, true},
    {"moe_layer_freq", 1.0, false},        {"num_nextn_predict_layers", 0, true},
    {"num_kv_shared_layers", 0, true},     {"hidden_size_per_layer_input", 0, true},
    {"sliding_window_pattern", 0, false},  {"full_attention_interval", 0, false},
    {"attention_sink", 0, true},           {"use_sliding_window_for_all", 0, true},
};

bool neutral(const json::value& v, const Refused& r) {
  if (v.is_null()) return true;
  if (r.zero_or_false) {
    if (v.is_bool()) return !v.as_bool();
    if (v.is_array()) return v.as_array().empty();
    if (v.is_int64()) return v.as_int64() == 0;
    if (v.is_uint64()) return v.as_uint64() == 0;
    if (v.is_double()) return v.as_double() == 0;
  }
  if (v.is_int64()) return double(v.as_int64()) == r.neutral;
  if (v.is_uint64()) return double(v.as_uint64()) == r.neutral;
  if (v.is_double()) return v.as_double() == r.neutral;
  return false;
}

}  // namespace

std::vector<std::string> config_keys_read(const ArchitectureSpec& a) {
  using S = ArchitectureSpec::Sliding;
  std::set<std::string> keys(std::begin(kCommon), std::end(kCommon));
  if (a.reads_attention_bias) keys.insert("attention_bias");
  if (a.reads_mlp_bias) keys.insert("mlp_bias");
  if (a.reads_qkv_bias) keys.insert("qkv_bias");
  if (a.sliding != S::none) keys.insert("sliding_window");
  if (a.sliding == S::layer_types) keys.insert({"layer_types", "use_sliding_window", "max_window_layers"});
  if (a.moe && !a.mla) {  // DeepSeek names its MoE keys its own way (below)
    keys.insert({"num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob"});
    if (a.model_type != "mixtral") keys.insert("moe_intermediate_size");
  }
  if (a.shared_expert) keys.insert("shared_expert_intermediate_size");
  if (a.reads_sparse_step) keys.insert({"decoder_sparse_step", "mlp_only_layers"});
  if (a.linear_attention)
    keys.insert({"layer_types", "full_attention_interval", "partial_rotary_factor", "attention_bias",
                 "linear_conv_kernel_dim", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
                 "linear_value_head_dim",
                 // A ConditionalGeneration checkpoint's other towers: their tensors are skipped by name.
                 "vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"});
  if (a.gemma4)
    keys.insert({"layer_types", "sliding_window", "per_layer_config", "global_head_dim", "num_global_key_value_heads",
                 "attention_k_eq_v", "num_kv_shared_layers", "hidden_size_per_layer_input",
                 "vocab_size_per_layer_input", "use_double_wide_mlp", "enable_moe_block", "num_experts",
                 "top_k_experts", "moe_intermediate_size", "hidden_activation", "final_logit_softcapping",
                 "use_bidirectional_attention", "attention_bias"});
  if (a.mla)
    keys.insert({"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim",
                 "rope_interleave", "attention_bias", "mlp_bias", "n_routed_experts", "n_shared_experts",
                 "moe_intermediate_size", "num_experts_per_tok", "routed_scaling_factor", "scoring_func",
                 "topk_method", "n_group", "topk_group", "norm_topk_prob", "first_k_dense_replace", "moe_layer_freq",
                 "num_nextn_predict_layers"});
  // gpt_oss: initial_context_length is OpenAI's name for the pre-YaRN context; GptOssConfig keeps it unread (the
  // rope parameters carry original_max_position_embeddings), so it changes nothing.
  if (a.gpt_oss) keys.insert({"swiglu_limit", "experts_per_token", "initial_context_length"});
  return {keys.begin(), keys.end()};
}

bool is_bookkeeping_key(const std::string& key) {
  return std::find(std::begin(kBookkeeping), std::end(kBookkeeping), key) != std::end(kBookkeeping) ||
         std::find(std::begin(kTowerKeys), std::end(kTowerKeys), key) != std::end(kTowerKeys);
}

std::vector<std::string> unread_config_keys(const json::object& config, const ArchitectureSpec& arch) {
  const std::vector<std::string> read = config_keys_read(arch);
  std::vector<std::string> unread;
  for (auto& kv : config) {
    const std::string key(kv.key());
    if (is_bookkeeping_key(key) || std::binary_search(read.begin(), read.end(), key)) continue;
    // Known math keys the engine refuses unless neutral (refuse_unimplemented_keys): audited, not unread.
    if (std::any_of(std::begin(kRefused), std::end(kRefused), [&](const Refused& r) { return key == r.key; })) continue;
    unread.push_back(key);
  }
  std::sort(unread.begin(), unread.end());
  return unread;
}

void refuse_unimplemented_keys(const json::object& config, const ArchitectureSpec& arch, const std::string& origin) {
  const std::vector<std::string> read = config_keys_read(arch);
  for (const Refused& r : kRefused) {
    auto it = config.find(r.key);
    if (it == config.end() || neutral(it->value(), r)) continue;
    if (std::binary_search(read.begin(), read.end(), std::string(r.key))) continue;  // the family implements it
    throw ModelError(fmt::format("{}: field '{}' ({}) is not supported for {} (it changes the model's math and "
                                 "tierlm does not implement it)",
                                 origin, r.key, json::serialize(it->value()), arch.model_type));
  }
  // Quantized checkpoints other than MLX's (GPTQ, AWQ, FP8, bitsandbytes...) carry quantization_config alone.
  if (config.contains("quantization_config") && !config.contains("quantization")) {
    const json::value& q = config.at("quantization_config");
    std::string method = "unknown";
    if (q.is_object() && q.as_object().contains("quant_method") && q.at("quant_method").is_string())
      method = std::string(q.at("quant_method").as_string());
    // DeepSeek's FP8 checkpoints: float8_e4m3fn weights with 128x128 f32 block scales, dequantized at load (and at an
    // expert miss) as transformers does; activations are never quantized (transformers' dequantize path).
    if (arch.mla && method == "fp8") {
      const json::object& fp8 = q.as_object();
      const json::value* block = fp8.if_contains("weight_block_size");
      const bool blocks_128 = block && block->is_array() && block->as_array().size() == 2 &&
                              block->as_array()[0].is_number() && block->as_array()[1].is_number() &&
                              block->as_array()[0].to_number<double>() == 128 &&
                              block->as_array()[1].to_number<double>() == 128;
      if (!blocks_128)
        throw ModelError(fmt::format("{}: field 'quantization_config.weight_block_size' must be [128, 128] (the FP8 "
                                     "block DeepSeek checkpoints use)", origin));
      for (const char* key : {"scale_fmt", "modules_to_convert"})
        if (const json::value* v = fp8.if_contains(key);
            v && !v->is_null() && !(v->is_string() && v->as_string() == "float"))
          throw ModelError(fmt::format("{}: field 'quantization_config.{}' is not supported", origin, key));
      return;
    }
    if (arch.gpt_oss && method == "mxfp4") return;  // read by parse_gpt_oss (MXFP4 experts)
    throw ModelError(fmt::format("{}: field 'quantization_config' (quant_method {}) is not supported (supported: "
                                 "unquantized f32/f16/bf16 and MLX 'quantization')", origin, method));
  }
}

void warn_unread_keys(const json::object& config, const ArchitectureSpec& arch, const std::string& origin) {
  const std::vector<std::string> unread = unread_config_keys(config, arch);
  if (!unread.empty())
    spdlog::warn("model: {}: config keys tierlm does not read for {}: {} (if one changes the math, the output will "
                 "differ from transformers)", origin, arch.model_type, fmt::join(unread, ", "));
}

}  // namespace tierlm::model
