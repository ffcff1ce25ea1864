// calibrate/planner.h — the Planner turns a DeviceProfile and a ModelProfile, a memory budget and a target context
// and batch into a Plan: every runtime setting the engine and the expert tier take, with the predicted speed, the
// predicted memory per ledger account, and the measurements behind each decision. The cost model is written down
// in calibrate/README.md; the constants it uses are named below.
// Never: measure (probes do), or exceed the budget: a plan that cannot fit throws PlanError saying what to change.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "calibrate/device_profile.h"
#include "calibrate/model_profile.h"

namespace tierlm::calibrate {

class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PlanRequest {
  uint64_t budget_bytes = 0;      // ledger budget; 0: kDefaultBudgetFraction of what the device may use now
  int64_t context = 4096;         // tokens per sequence the KV cache must hold
  int64_t batch = 1;              // sequences decoded together (serve's --max-batch)
  // The batch is a default, not asked for: when its KV does not fit beside the weights and the minimum expert cache,
  // halve it (down to 1) instead of failing; the plan records the batch it was sized for.
  bool fit_batch = false;
  std::optional<std::string> kv_codec;  // force a codec (f16, q8, turbo4, turbo3)
  std::optional<int> threads;
  std::optional<int64_t> gpu_layers;    // at most this many GPU layers (0: CPU only)
  uint64_t gpu_budget_bytes = 0;        // VRAM the plan may use at most (0: free device memory - kGpuReserveBytes)
  // When given, cache hit rates are replayed on it instead of estimated: make_plan ranks the resident set on its
  // first half and replays the second (RouterTrace::held_out_from), so the plan is never judged on the tokens it was
  // chosen on.
  const RouterTrace* trace = nullptr;
  // false: rank and replay the whole trace, the resident set judged on the tokens it was chosen on (the planner
  // before the held-out split; only bench/fit_accuracy_bench asks for it, to show the two side by side).
  bool hold_out_trace = true;
};

// Cost-model constants (see calibrate/README.md for where they come from).
inline constexpr double kDefaultBudgetFraction = 0.85;  // of MemoryInfo::usable(): the rest is the process/OS
// Fallbacks only, for model profiles without ModelProfile::timings (synthetic profiles, dense models): calibration
// measures the per-step fixed cost and the per-expert cost on the model itself.
inline constexpr double kLayerOverheadSeconds = 30e-6;  // fork/join, norms, RoPE, softmax per layer and step
inline constexpr double kExpertOverheadSeconds = 8e-6;  // request/acquire/release and two matvec launches per expert
                                                        // (a decode row's resident experts: per layer, together)
// GPU: not measurable on the development machine (no GPU), so constants: cost per GPU layer beyond streaming its
// weights (attention, kernel boundaries, the step's host work spread over the layers) and per VRAM expert, VRAM
// kept free besides the plan (the CUDA context, cuBLAS workspace), and device scratch. The layer constant is
// gpu_bench on an H100 (2026-11-23): llama-1B bf16 decode step 1403 us = 829 us of weights at the measured d2d
// rate + 574 us, i.e. 36 us per layer (it was 90 us before the decode kernels were reworked).
inline constexpr double kGpuLayerOverheadSeconds = 36e-6;
inline constexpr double kGpuExpertOverheadSeconds = 10e-6;
inline constexpr uint64_t kGpuReserveBytes = 1ull << 30;  // GpuOptions' default: free memory minus 1 GiB
inline constexpr uint64_t kGpuScratchBytes = 256ull << 20;
// Hybrid MoE placement: copying an expert that is not in VRAM first goes through pinned staging with one CPU thread's
// memcpy (runtime/gpu/gpu_layers.cpp host_routed), then over PCIe; a copy costs its bytes at the slower of this and
// the measured H2D rate. A single core's memcpy on the H100/H200 hosts' Xeons: not probed, a constant.
inline constexpr double kStagingCopyGbs = 10.0;
inline constexpr double kGemmEfficiency = 0.6;          // fraction of square-SGEMM GFLOP/s prefill reaches
// A turbo KV codec is picked by the planner only where calibrate measured it on this model at most this much above the
// exact cache's perplexity (ModelProfile::kv_perplexity_increase); --kv-codec still forces any codec.
inline constexpr double kKvMaxPerplexityIncrease = 0.01;
inline constexpr double kKvShareOfFreeMemory = 0.25;    // a codec is "comfortable" if KV fits in this share

// Why a decision was made: the decision, its value, and the measurements it rests on.
struct Rationale {
  std::string decision, value, because;
  std::map<std::string, double> measurements;
};

struct Prediction {
  double decode_tokens_per_second = 0;   // all sequences of the batch together
  double prefill_tokens_per_second = 0;
  double expert_hit_rate = 1;            // fraction of routed experts found in memory (resident or slot)
  double miss_bytes_per_token = 0;       // expert bytes read from storage per decoded token (one sequence)
  // Seconds per decode step by term: dense, experts, misses, kv, overhead, gpu.
  std::map<std::string, double> step_seconds;
  std::map<std::string, uint64_t> memory;  // bytes per ledger account held by the running engine
  // The scratch account's peak over the process: loading stages whole matrices there before the engine's buffers
  // exist, so it can exceed memory["scratch"] (ModelProfile::load_scratch_bytes).
  uint64_t scratch_peak_bytes = 0;
  std::map<std::string, uint64_t> vram;    // bytes per VRAM account (weights, kv, resident_experts, expert_slots, scratch)
  double gpu_expert_hit_rate = 1;          // routed experts of GPU layers found in VRAM
  uint64_t total_memory() const;
};

struct Plan {
  static constexpr int kSchemaVersion = 1;
  std::string device_fingerprint, model_fingerprint;
  uint64_t budget_bytes = 0;
  int64_t context = 0, batch = 1;
  int gpu_layers = 0;             // layers [0, gpu_layers) on the GPU (gpu::GpuOptions::layers)
  std::string gpu_reason;
  // MoE on the GPU: per GPU layer, the experts kept in VRAM for the whole run; evictable VRAM slots for the rest.
  std::vector<std::vector<int32_t>> gpu_resident_experts;
  int64_t gpu_expert_slots = 0;
  // Hybrid MoE placement (gpu::GpuOptions::cpu_expert_rows): steps of at most this many rows run the GPU layers'
  // experts that are not in VRAM on the CPU instead of copying them (0: always copy).
  int64_t gpu_cpu_expert_rows = 0;
  std::string gpu_kv_codec = "f16";  // f16 | q8 (the device KV)
  uint64_t gpu_budget_bytes = 0;     // VRAM the plan may use
  // Per MoE layer: the expert ids kept in memory for the whole run.
  std::vector<std::vector<int32_t>> resident_experts;
  int64_t cache_slots = 0;
  std::string cache_policy = "lru";
  int64_t prefetch_limit = 0;
  unsigned reader_queue_depth = 32;
  uint64_t reader_block_size = 1 << 20;
  bool reader_direct = true;
  std::string kv_codec = "f16";
  int threads = 1;
  std::string numa_placement;
  int64_t prefill_chunk = 128;
  Prediction prediction;
  std::vector<Rationale> rationale;

  int64_t resident_count() const;
  int64_t gpu_resident_count() const;
};

Plan make_plan(const DeviceProfile& device, const ModelProfile& model, const PlanRequest& request);
// A full chunk's prefill rate with the plan (Prediction::prefill_tokens_per_second). Nothing make_plan chooses
// depends on the model's prefill rates, so once they change (probe_prefill) this alone moves: plan.prediction's
// prefill_tokens_per_second = predicted_prefill_rate(device, model, plan), without planning again.
double predicted_prefill_rate(const DeviceProfile& device, const ModelProfile& model, const Plan& plan);

// Seconds to prefill a prompt of `tokens` with the plan (chunks of plan.prefill_chunk; the cost model of
// Prediction::prefill_tokens_per_second, which is one full chunk's rate; calibrate/README.md).
double prefill_seconds(const DeviceProfile& device, const ModelProfile& model, const Plan& plan, int64_t tokens);
// prefill_seconds by term, seconds over the whole prompt: the layers' dense matrices, attention over the positions
// each row sees, the output head (one row per chunk), the per-row work between the GEMMs (norms, RoPE, KV stores,
// activations, residuals), and the MoE layers' experts (the longer of their compute and their reads, per layer).
struct PrefillCost {
  double dense = 0, attention = 0, head = 0, rows = 0, experts = 0;
  double total() const { return dense + attention + head + rows + experts; }
};
PrefillCost prefill_cost(const DeviceProfile& device, const ModelProfile& model, const Plan& plan, int64_t tokens);

// KV bytes per token (all full-attention layers, one sequence) of a codec for a model shape; throws
// std::invalid_argument for an unknown codec or one the head_dim cannot use.
double kv_bytes_per_token(const ModelProfile& model, const std::string& codec);
// KV bytes of one sequence of `context` positions prefilled in chunks of `chunk` (all layers, as KVCache allocates
// them: sliding-window layers bounded to their window + one chunk; ModelProfile::state_spec); throws like
// kv_bytes_per_token.
uint64_t kv_sequence_bytes(const ModelProfile& model, const std::string& codec, int64_t context, int64_t chunk);
// Bytes of the KV caches of `batch` sequences of `context` positions (whole pages, allocated up front, prefilled in
// chunks of `chunk`: windowed layers bounded by kv_sequence_bytes): the one place the planner turns a model shape into
// KV memory.
uint64_t kv_cache_bytes(const ModelProfile& model, const std::string& codec, int64_t context, int64_t batch,
                        int64_t chunk = 1);
// The expert reader's block and queue depth for this model on this storage, from the expert's own reads
// (ModelProfile::read_extents) and the storage sweep: among the probed (block, depth) cells whose depth holds every
// request of one layer's top_k misses at once (the reader starts requests beyond its depth only when the forward
// thread polls it again, after the compute the reads were to overlap), the one reading them soonest: top_k x the
// expert's bytes / the cell's GB/s + their requests x the cell's CPU seconds per read; within 5% of that (the
// probe's spread), the fewest requests. Where no cell holds them all, the deepest cells' fewest submissions. A block
// above the smallest one covering the longest read is no candidate (its requests would be shorter than probed).
// Without a sweep: 1 MiB x 32 (ReaderOptions' defaults).
struct ReaderChoice {
  uint64_t block_size = 1ull << 20;
  unsigned queue_depth = 32;
  double gbs = 0, seconds = 0;
  int64_t requests_per_expert = 0;
  int64_t submissions = 0;  // queue-depth waves one layer's top_k misses take (1: all in flight at once)
};
ReaderChoice choose_reader(const StorageInfo& storage, const ModelProfile& model);

// Fraction of routed experts found in memory, by the LRU characteristic-time approximation (no trace) or by
// replaying the trace through resident set + LRU slots.
double estimate_hit_rate(const ModelProfile& model, const std::vector<std::vector<int32_t>>& resident, int64_t slots,
                         const RouterTrace* trace);

boost::json::value to_json(const Plan& plan);
Plan plan_from_json(const boost::json::value& v);

}  // namespace tierlm::calibrate
