// calibrate/model_profile.h — what the planner needs to know about a model: the bytes of every weight class in the
// formats it will run in, the shape that sizes KV and scratch, and, for MoE models, how often each expert is chosen
// (measured by running profiles/prompts/ through the routers).
// Never: keep the model loaded; the profile is plain data with a JSON form stored in the wisdom file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "runtime/kv/state_spec.h"
#include "runtime/kernels/weights.h"
#include "runtime/model/config.h"

namespace tierlm::calibrate {

struct WeightClass {
  std::string name;   // embedding, output, attention, dense_mlp, router, shared_expert, norms, experts
  uint64_t bytes = 0; // in memory, in the run format
  uint64_t read_per_token = 0;  // bytes a decode step streams from this class (experts: k per MoE layer)
};

// Routed experts per token, as the calibration prompts exercised them: selections[t][l][j] flattened.
struct RouterTrace {
  int64_t layers = 0, experts = 0, top_k = 0;
  std::vector<int32_t> selections;  // tokens * layers * top_k expert ids
  // A replay (estimate_hit_rate) counts hits from this token on; the tokens before it only warm the LRU slots. The
  // planner sets it to hold out the part of the trace it did not choose the resident set on (0: count every token).
  int64_t held_out_from = 0;
  int64_t tokens() const { return layers > 0 && top_k > 0 ? int64_t(selections.size()) / (layers * top_k) : 0; }
};

// Decode costs measured on the loaded model itself at one thread count (calibration runs them for each thread count
// the device probe covers). They replace fixed per-layer and per-expert constants in the cost model.
struct ModelTiming {
  int threads = 0;
  double step_seconds = 0;    // one decode step, one token, every layer's top_k experts in memory (fixed routing)
  double expert_seconds = 0;  // one expert on one row: cache acquire, gate_up matvec, SiLU, down matvec, release
  double router_seconds = 0;  // one router matvec + softmax/top-k (the real router; the timed step used fixed routing)
  double miss_seconds = 0;        // one expert missing alone: request, read (the profile's reader), conversion, acquire
  double miss_batch_seconds = 0;  // per expert when top_k missing experts of one layer are requested together
};

// One of the model's dense prefill matrices as kernels::matmul runs it on this machine (calibrate's
// probe_prefill: random weights of the model's format and shape): GFLOP/s at each probed activation-row count,
// rows ascending. `out` may be a slice of a taller weight (a probe's memory and time bound); the rate is the shape's.
struct PrefillGemm {
  std::string kind;             // qkv | o | gate_up | down | router (dense_gemm_shapes)
  std::string format;           // the weight's format name
  int64_t out = 0, in = 0;      // the weight's [out x in] as probed
  int threads = 0;
  std::vector<int64_t> rows;    // activation rows probed
  std::vector<double> gflops;   // at each of them
};

// What prefill costs on this machine beyond the device profile (calibrate's probe_prefill, at the plan's threads):
// the model's dense shapes, and the per-row work between the GEMMs, seconds per element on one thread: the MLP's
// gate (silu_gate: an exp per element) and a pass over a row (rms_norm; the MoE block's gather and weighted
// scatter-add are passes like it). 0: not probed. And attention as the engine runs it (probe_prefill_attention): seconds
// per query head and position seen, at `attention_threads` in KV `attention_codec` (0: not probed, or a model whose
// attention the probe does not run: the planner then prices it as f32 GEMM flops).
struct PrefillRates {
  std::vector<PrefillGemm> gemms;
  double gate_seconds = 0, row_seconds = 0;
  double attention_seconds = 0;
  int attention_threads = 0;
  std::string attention_codec;
  // The model's own experts (its hidden and expert intermediate, its expert format) on the engine's lanes, at
  // expert_rows rows each (a 128-row chunk's rows x top_k over the experts) and expert_threads: GFLOP/s (0: not
  // probed; the device's expert probe, of Qwen3-30B-A3B's shape at 16 rows, stands in).
  double expert_gflops = 0;
  int expert_threads = 0;
  int64_t expert_rows = 0;
  std::string expert_format;
};

// A dense matrix every layer applies in prefill, as the engine fuses them (Forward: one qkv projection, o, one
// gate_up, down; an MoE layer's router instead of the MLP): [out x in], one of each per layer.
struct GemmShape {
  std::string kind;
  int64_t out = 0, in = 0;
};

struct ModelProfile {
  static constexpr int kSchemaVersion = 1;
  std::string path, name, model_type, fingerprint;
  std::string weight_format, expert_format;  // the dense matrices' and the experts' in-memory formats
  int64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t max_context = 0;
  // Per layer: 0 for full attention, else its sliding window (empty: every layer full). state_spec(l) is what the
  // planner asks for KV bytes, as the KV cache does (runtime/kv/state_spec.h).
  std::vector<int64_t> layer_windows;
  // Per layer: the fixed state bytes of a recurrent layer (Gated DeltaNet), 0 for attention (empty: none).
  std::vector<uint64_t> layer_recurrent_bytes;
  // Per layer, when layers differ from the model-wide kv_heads / head_dim (Gemma 4: full-attention layers with
  // their own head size and KV heads, KV-shared layers holding none); empty: every layer has the model-wide shape.
  std::vector<int64_t> layer_kv_heads, layer_head_dims;
  // Per layer: the f32 per position of an MLA layer's latent rows (kv_lora_rank + rope dims), 0 otherwise (empty:
  // no MLA layer).
  std::vector<int64_t> layer_latent_floats;
  kv::StateSpec state_spec(int64_t layer) const {
    return {layer_kv_heads.empty() ? kv_heads : layer_kv_heads.at(size_t(layer)),
            layer_head_dims.empty() ? head_dim : layer_head_dims.at(size_t(layer)),
            layer_windows.empty() ? 0 : layer_windows.at(size_t(layer)),
            layer_recurrent_bytes.empty() ? 0 : layer_recurrent_bytes.at(size_t(layer)),
            layer_latent_floats.empty() ? 0 : layer_latent_floats.at(size_t(layer))};
  }
  // MoE (experts == 0 for dense models).
  int64_t experts = 0, top_k = 0, moe_layers = 0, moe_intermediate = 0;
  int64_t shared_intermediate = 0;    // qwen2_moe's shared expert (0: none); it shares the MoE block's scratch
  // Peak scratch while loading: the largest dense matrix staged in f32 for conversion (or an MLX matrix's packed
  // copy), or one expert's read staging while the resident set is read.
  uint64_t load_scratch_bytes = 0;
  // The engine's runtime scratch (Forward with its MoE block and mixers), measured on the loaded model: bytes per
  // row of a step and the fixed rest (measure_model_profile builds Forward at 1 and 2 rows). 0: not measured (a
  // profile from config.json or an older wisdom file), the planner then estimates it from the shape.
  uint64_t scratch_row_bytes = 0, scratch_fixed_bytes = 0;
  // One row of one of the MoE block's prefill lanes (engine::moe_lane_bytes; the planner charges a lane of up to
  // kLaneRows rows per thread), left out of scratch_row_bytes. 0: none, or not measured (the planner then takes it
  // from the shape).
  uint64_t lane_row_bytes = 0;
  // What each pool thread beyond the first adds besides its lane (MLA's per-thread work rows); 0: none or not measured.
  uint64_t scratch_thread_bytes = 0;
  uint64_t expert_bytes = 0;          // one expert block in memory (a resident expert or a cache slot)
  uint64_t expert_payload_bytes = 0;  // what one expert's matvecs stream (without alignment padding)
  uint64_t expert_read_bytes = 0;     // bytes one miss reads from disk
  // The reads one miss issues, in order (4 KiB aligned lengths summing to expert_read_bytes): one for a packed file,
  // three for dense per-expert tensors, six for MXFP4, nine for MLX. Empty: one read of expert_read_bytes. The
  // planner sizes the reader's block from them (a read longer than the block is split into several requests).
  std::vector<uint64_t> expert_read_extents;
  uint64_t expert_staging_bytes = 0;  // extra per slot when the disk format needs conversion (0: packed file)
  uint64_t expert_conversion_bytes = 0;  // the cache's one-off conversion reservation ("expert_staging")
  bool packed_experts = false;
  std::vector<WeightClass> classes;
  // frequency[l][e]: fraction of tokens whose top-k at MoE layer l includes e (each layer sums to top_k).
  std::vector<std::vector<double>> expert_frequency;
  std::string frequency_source;  // "router traces: N prompts, T tokens" or "uniform (...)"
  int64_t traced_prompts = 0, traced_tokens = 0;
  // The router trace itself (RouterTrace::selections: tokens x moe_layers x top_k ids), kept so that a plan made
  // again from the wisdom file (serve's re-fit) is judged on its held-out half as calibrate's was. Empty: none.
  std::vector<int32_t> trace_selections;
  RouterTrace router_trace() const { return {moe_layers, experts, top_k, trace_selections}; }
  std::vector<ModelTiming> timings;  // empty: the planner falls back to its constants
  // Prefill timed on this machine by the model's shapes (probe_prefill at the plan's threads); empty (a profile
  // written before them, or fit on another machine's device profile): the planner takes the device's square-weight
  // GEMM probe and charges no per-row work.
  PrefillRates prefill;
  // KV codec quality measured on this model (measure_kv_quality): each lossy codec's perplexity increase over the
  // exact f32 cache on profiles/text/kv-quality.txt (0.008 = +0.8%). The planner picks a turbo codec by itself only
  // where it is measured at most kKvMaxPerplexityIncrease; empty: not measured (a config-only profile, --quick).
  std::map<std::string, double> kv_perplexity_increase;
  int64_t kv_quality_tokens = 0;      // tokens the perplexities were measured on

  bool moe() const { return experts > 0; }
  // The dense matrices each layer multiplies in prefill (attention projections, then the MLP or the router), in the
  // uniform shape of the model-wide heads and sizes; the experts and the output head are apart.
  std::vector<GemmShape> dense_gemm_shapes() const;
  // Everything held in memory whatever the plan (all classes but the routed experts).
  uint64_t dense_bytes() const;
  uint64_t dense_read_per_token() const;
  uint64_t total_expert_bytes() const { return uint64_t(moe_layers * experts) * expert_bytes; }
  std::vector<uint64_t> read_extents() const {
    return expert_read_extents.empty() ? std::vector<uint64_t>{expert_read_bytes} : expert_read_extents;
  }
};

// Bytes of a [rows x cols] matrix in a kernel format (packed layouts rounded as the kernels pad them).
uint64_t matrix_bytes(kernels::WeightFormat format, int64_t rows, int64_t cols);

// A profile from config.json alone (no weights read): sizes by format, uniform expert frequencies. Used for
// synthetic planning and when a model is profiled without traces.
ModelProfile model_profile_from_config(const model::ModelConfig& config, kernels::WeightFormat weight_format,
                                       kernels::WeightFormat expert_format);

struct ModelProfileOptions {
  std::string prompts_dir = std::string(TIERLM_SOURCE_DIR) + "/profiles/prompts";
  int64_t max_tokens_per_prompt = 48;  // prompt tokens routed per prompt (decode steps, one token each)
  int64_t max_prompts = 0;             // 0: all
  double max_seconds = 60;             // stop tracing after this long (the profile says how much was traced)
  int threads = 0;
  std::string weight_format;           // "" : as stored
  std::function<void(const std::string&, size_t, size_t)> progress;
  RouterTrace* trace = nullptr;        // when given, receives the per-token selections
  // Thread counts to time decode costs at (ModelTiming); empty: none. Each measurement is bounded by
  // timing_seconds.
  std::vector<int> timing_threads;
  double timing_seconds = 0.3;
  double kv_quality_seconds = 60;      // the KV codec quality pass (calibrate/kv_quality.h); 0: skipped
  // The ledger budget of the model measurement (0: unbounded). The dense weights load within it and the expert
  // cache takes the room left (less an eighth of the budget, at most kMeasureLeaveFreeBytes, for the traces' KV and
  // the engine's scratch), at most layers x top_k slots: in a cgroup of 2x the dense weights an unpacked bf16 MoE's
  // layers x top_k slots alone would not fit.
  uint64_t memory_budget_bytes = 0;
  // When given, receives the measurement's ledger peak and the expert cache's slots (MoE models).
  struct Memory {
    uint64_t ledger_peak = 0;
    int64_t cache_slots = 0;
  };
  Memory* memory = nullptr;
};
inline constexpr uint64_t kMeasureLeaveFreeBytes = 128ull << 20;

// Loads the model (dense part; experts stay on disk), measures the bytes of each class from the loaded weights and
// the expert tier, and for MoE models runs the prompts token by token, recording each layer's routed experts.
ModelProfile measure_model_profile(const std::filesystem::path& model_dir, const ModelProfileOptions& options);

// Identity of a model: config.json, the names and sizes of its weight files and the first 64 KiB of each
// (safetensors headers), the run formats. 16 hex digits.
std::string model_fingerprint(const std::filesystem::path& model_dir, const std::string& formats);
// A model folder's weight files (*.safetensors shards, a packed *.tierlm expert file), sorted by name; none for a
// folder that does not exist.
std::vector<std::filesystem::path> model_weight_files(const std::filesystem::path& model_dir);

// Expert frequencies from a trace (rows sum to top_k), over its tokens [first, last) (last < 0: to the end).
std::vector<std::vector<double>> frequencies(const RouterTrace& trace, int64_t first = 0, int64_t last = -1);

boost::json::value to_json(const ModelProfile& p);
ModelProfile model_profile_from_json(const boost::json::value& v);

}  // namespace tierlm::calibrate
