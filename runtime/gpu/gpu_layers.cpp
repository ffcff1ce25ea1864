// runtime/gpu/gpu_layers.cpp — orchestration of the GPU layers (see gpu_layers.h). Kernels are in
// device_kernels.cu and prefill_kernels.cu; cuBLAS does the multi-row products (prefill): packed weights are
// dequantized to f16 in row chunks into scratch and multiplied against f16 activations with f32 accumulation (MLX
// weights: activations split in two f16 parts, or f32 GEMMs in the exact configuration; see multiply). Up to
// device::kMaxMatvecRows rows use our matvec straight on the packed bytes, which is what decode reads. Prefill
// attention runs by tiles of a sequence's rows (prefill_attention), decode attention split over positions.
// First use: the constructor ends with a warm-up (see warm_up()), so that a process's first prompt does not pay
// for lazy kernel loading, cuBLAS's first calls per shape and the decode graphs' capture.
#include "runtime/gpu/gpu_layers.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tierlm::gpu {

namespace {
// The widest attention head the GPU's attention kernels take (device::kMaxHeadDim, which the host-only build does not
// see; asserted equal below).
constexpr int64_t kMaxAttentionHeadDim = 512;
}  // namespace

int64_t GpuLayers::kv_layer_pages(int64_t window, int64_t context, int64_t max_chunk) {
  const int64_t page = kv_page_positions(), all = (context + page - 1) / page;
  if (window <= 0) return all;
  // A step of up to max_chunk rows starting at p needs positions [p - window + 1, p + max_chunk) at once.
  return std::min(all, (window - 1 + std::max<int64_t>(max_chunk, 1) + page - 1) / page + 1);
}

}  // namespace tierlm::gpu

#ifdef TIERLM_HAVE_CUDA

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/engine/moe.h"
#include "runtime/engine/ops.h"
#include "runtime/gpu/cublas_loader.h"
#include "runtime/gpu/deltanet_kernels.cuh"
#include "runtime/gpu/device_kernels.cuh"
#include "runtime/gpu/gemma4_kernels.cuh"
#include "runtime/gpu/mla_kernels.cuh"
#include "runtime/gpu/gpu_probe.h"
#include "runtime/gpu/split_f16.cuh"
#include "runtime/kernels/weights.h"
#include "tiering/expert_tier.h"

namespace tierlm::gpu {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("gpu: ") + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("gpu: ") + what + ": cuBLAS status " +
                                                           std::to_string(int(s)));
}

// Device memory charged to the VRAM ledger for its whole life.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(tiering::Ledger& ledger, std::string account, size_t bytes) : ledger_(&ledger), account_(account) {
    bytes = std::max<size_t>(bytes, 256);
    ledger.charge(account_, bytes);
    if (cudaMalloc(&data_, bytes) != cudaSuccess) {
      ledger.release(account_, bytes);
      cudaGetLastError();
      throw tiering::LedgerError("gpu: cudaMalloc of " + std::to_string(bytes) + " bytes for '" + account_ +
                                 "' failed");
    }
    size_ = bytes;
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(ledger_, o.ledger_);
      std::swap(account_, o.account_);
      std::swap(data_, o.data_);
      std::swap(size_, o.size_);
    }
    return *this;
  }
  void reset() noexcept {
    if (data_) {
      cudaFree(data_);
      ledger_->release(account_, size_);
    }
    data_ = nullptr;
    size_ = 0;
  }
  template <class T = void> T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return size_; }

 private:
  tiering::Ledger* ledger_ = nullptr;
  std::string account_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Pinned host memory (staging of transfers), charged to the host ledger when there is one.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(tiering::Ledger* ledger, size_t bytes) : ledger_(ledger) {
    bytes = std::max<size_t>(bytes, 64);
    if (ledger_) ledger_->charge("gpu_staging", bytes);
    if (cudaMallocHost(&data_, bytes) != cudaSuccess) {
      cudaGetLastError();
      if (ledger_) ledger_->release("gpu_staging", bytes);
      throw tiering::LedgerError("gpu: cudaMallocHost of " + std::to_string(bytes) + " bytes of pinned staging failed");
    }
    size_ = bytes;
  }
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(ledger_, o.ledger_);
      std::swap(data_, o.data_);
      std::swap(size_, o.size_);
    }
    return *this;
  }
  void reset() noexcept {
    if (data_) {
      cudaFreeHost(data_);
      if (ledger_) ledger_->release("gpu_staging", size_);
    }
    data_ = nullptr;
    size_ = 0;
  }
  template <class T = void> T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return size_; }

 private:
  tiering::Ledger* ledger_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

size_t scale_size(kernels::SourceType t) { return t == kernels::SourceType::f32 ? 4 : 2; }

struct PartSizes {
  uint64_t data = 0, scales = 0, biases = 0;
};

PartSizes part_sizes(const kernels::WeightView& w) {
  using kernels::WeightFormat;
  PartSizes s;
  if (w.format == WeightFormat::f32 || w.format == WeightFormat::f16 || w.format == WeightFormat::bf16) {
    s.data = uint64_t(w.rows) * uint64_t(w.cols) * (w.format == WeightFormat::f32 ? 4 : 2);
    return s;
  }
  if (w.format == WeightFormat::mxfp4) {  // row-major: 16 code bytes and one E8M0 byte per 32 columns
    s.data = uint64_t(w.rows) * uint64_t(w.cols) / 2;
    s.scales = uint64_t(w.rows) * uint64_t(w.cols) / 32;
    return s;
  }
  const uint64_t panels = uint64_t((w.rows + 15) / 16);
  s.data = panels * 16 * uint64_t(w.cols) * uint64_t(w.bits) / 8;
  s.scales = panels * uint64_t(w.cols / w.group_size) * 16 * scale_size(w.scale_type);
  s.biases = w.format == WeightFormat::q8_0 ? 0 : s.scales;
  return s;
}

int scale_code(kernels::SourceType t) {
  return t == kernels::SourceType::f32 ? 0 : t == kernels::SourceType::f16 ? 1 : 2;
}

// A weight's view with its pointers replaced (the device copy, or an expert in a VRAM block).
device::MatrixRef matrix_ref(const kernels::WeightView& w, const void* data, const void* scales, const void* biases) {
  device::MatrixRef m;
  m.format = int(w.format);
  m.rows = w.rows;
  m.cols = w.cols;
  m.data = data;
  m.scales = scales;
  m.biases = w.format == kernels::WeightFormat::q8_0 ? nullptr : biases;
  m.scale_type = scale_code(w.scale_type);
  m.group_size = w.group_size;
  m.bits = w.bits;
  return m;
}

struct DeviceMatrix {
  DeviceBuffer buffer;
  device::MatrixRef ref;
  bool present() const { return ref.rows > 0; }
};

// widen: an f16/bf16 matrix goes up as f32 (converted by the host's dequantize_row, 16 MiB of rows at a time).
DeviceMatrix upload(const kernels::WeightView& w, tiering::Ledger& ledger, const char* account, bool widen = false) {
  DeviceMatrix m;
  if (w.rows == 0) return m;
  if (widen && (w.format == kernels::WeightFormat::f16 || w.format == kernels::WeightFormat::bf16)) {
    m.buffer = DeviceBuffer(ledger, account, size_t(w.rows * w.cols) * 4);
    const int64_t chunk = std::max<int64_t>(1, (int64_t(4) << 20) / w.cols);
    std::vector<float> rows(static_cast<size_t>(std::min(chunk, w.rows) * w.cols));
    for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
      const int64_t count = std::min(chunk, w.rows - r0);
      for (int64_t r = 0; r < count; ++r) kernels::dequantize_row(w, r0 + r, rows.data() + r * w.cols);
      check(cudaMemcpy(m.buffer.as<float>() + r0 * w.cols, rows.data(), size_t(count * w.cols) * 4,
                       cudaMemcpyHostToDevice),
            "upload widened weight");
    }
    kernels::WeightView f32 = w;
    f32.format = kernels::WeightFormat::f32;
    m.ref = matrix_ref(f32, m.buffer.as(), nullptr, nullptr);
    return m;
  }
  const PartSizes s = part_sizes(w);
  const uint64_t scales_at = (s.data + 255) / 256 * 256, biases_at = scales_at + (s.scales + 255) / 256 * 256;
  m.buffer = DeviceBuffer(ledger, account, biases_at + s.biases);
  char* base = m.buffer.as<char>();
  check(cudaMemcpy(base, w.data, s.data, cudaMemcpyHostToDevice), "upload weight");
  if (s.scales) check(cudaMemcpy(base + scales_at, w.scales, s.scales, cudaMemcpyHostToDevice), "upload scales");
  if (s.biases) check(cudaMemcpy(base + biases_at, w.biases, s.biases, cudaMemcpyHostToDevice), "upload biases");
  m.ref = matrix_ref(w, base, s.scales ? base + scales_at : nullptr, s.biases ? base + biases_at : nullptr);
  return m;
}

DeviceBuffer upload_floats(const float* v, size_t count, tiering::Ledger& ledger, const char* account) {
  if (count == 0) return {};
  DeviceBuffer b(ledger, account, count * sizeof(float));
  check(cudaMemcpy(b.as(), v, count * sizeof(float), cudaMemcpyHostToDevice), "upload floats");
  return b;
}
DeviceBuffer upload_floats(const std::vector<float>& v, tiering::Ledger& ledger, const char* account) {
  return upload_floats(v.data(), v.size(), ledger, account);
}

struct DeviceLayer {
  DeviceMatrix qkv, o, gate_up, down, router, shared_gate_up, shared_down;
  // Every matrix of the layer (absent ones have no rows).
  std::array<const DeviceMatrix*, 12> matrices() const {
    return {&qkv, &o, &gate_up, &down, &router, &shared_gate_up, &shared_down, &mla_in, &q_b, &linear_in, &ple_gate,
            &ple_projection};
  }
  DeviceBuffer input_norm, post_norm, qkv_bias, q_norm, k_norm, shared_expert_gate;
  // Biases (llama attention_bias / mlp_bias, gpt-oss) and gpt-oss's attention sinks; absent: empty.
  DeviceBuffer o_bias, gate_up_bias, down_bias, sinks;
  int64_t window = 0;  // sliding_attention: the positions a query sees; 0: all
  bool sparse = false;        // the MoE block (else the dense MLP: mlp_only_layers / decoder_sparse_step)
  int64_t expert_layer = -1;  // sparse: this layer's index in the expert tier (host cache requests)
  int64_t intermediate = 0;   // dense: the MLP width
  // MLA layers (DeepSeek; runtime/model/mla_weights.h): [q_a | kv_a] (or [q | kv_a]), q_b, the LoRA norms and
  // kv_b_proj's halves in f32; the latent KV lives in latent_refs.
  bool mla = false;
  DeviceMatrix mla_in, q_b;
  DeviceBuffer q_a_norm, kv_a_norm, kv_b_key, kv_b_value;
  // Gated DeltaNet layers (qwen3_5 linear_attention): [qkv | z | b | a] in one matrix, the conv taps, -exp(A_log),
  // dt_bias and RMSNormGated's weight (out_proj is `o`); the per-sequence states in `state`, a slot per sequence.
  bool deltanet = false;
  DeviceMatrix linear_in;
  DeviceBuffer conv, decay_rate, dt_bias, gated_norm, state;
  // Attention shape: the model's, or the layer's own (Gemma 4's full layers: global_head_dim, their KV heads).
  int64_t head_dim = 0, kv_heads = 0;
  // Gemma 4 (gemma4_layer): the KV-shared layers' source (-1: its own KV), k_eq_v, the layer's RoPE table (its layer
  // type's rope_parameters) and dims turned, the query scale (attention_scale * sqrt(head_dim): the attention kernels
  // divide by sqrt(head_dim)), the sandwich norms, the MoE block's norms and router scale (per_expert_scale stays on
  // the host, which routes), the per-layer input gate / projection / norm, layer_scalar.
  bool gemma4 = false, k_eq_v = false;
  int64_t kv_source = -1, rotary_dim = 0;
  float q_scale = 1.0f, layer_scalar = 1.0f;
  DeviceBuffer rope_inv_freq, pre_ffn_norm, post_ffn_norm, post_ffn_norm_1, pre_ffn_norm_2, post_ffn_norm_2,
      router_scale, post_ple_norm;
  DeviceMatrix ple_gate, ple_projection;
};

struct SequenceKv {
  std::vector<int32_t> pages;         // full-attention layers: positions [64 i, 64 i + 64) are in pool page pages[i]
  // Sliding-window layers: positions [64 i, 64 i + 64) are in ring pool page ring[i % ring_pages] (at most
  // ring_pages pages, taken as the sequence grows).
  std::vector<int32_t> ring;
  int64_t filled = 0;                 // positions [0, filled) written
  int32_t state_slot = -1;            // models with Gated DeltaNet layers on the GPU: its slot in their states
  int64_t written = 0;                // the furthest end ever written (the ring may have reused pages up to it)
  uint64_t last_use = 0;
};

uint64_t default_budget() {
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const uint64_t reserve = 1ull << 30;
  return free_bytes > reserve ? free_bytes - reserve : free_bytes / 2;
}

}  // namespace

struct GpuLayers::Impl {
  const model::ModelWeights& w;
  const model::ModelConfig& c;
  GpuOptions options;
  int64_t gpu_layers, max_chunk, max_context;
  bool head;
  tiering::Ledger vram;
  cudaStream_t stream = nullptr, copy_stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::vector<DeviceLayer> layers;
  DeviceMatrix output;
  DeviceBuffer final_norm, inv_freq;
  float rope_scale = 1.0f;
  int64_t rotary_dim = 0;  // dims RoPE turns per head (partial_rotary_factor), from the host's frequency table
  // MLA (c.arch.mla): the rope dims' frequency table, the kernels' shape, scratch (the [q_a | kv_a] rows, the
  // normed q_a, q, the absorbed queries, the roped query dims, the heads' outputs) and each layer's latent KV.
  DeviceBuffer mla_inv_freq, mla_proj, mla_qa, mla_q, mla_q_latent, mla_q_rope, mla_out, mla_split;
  int64_t mla_split_rows = 0;  // steps of at most this many rows attend in the split form (mla_split: its partials)
  device::MlaParams mla_shape;
  std::vector<device::LatentKv> latent_refs;  // per layer (rows null on other layers)
  engine::RouteScratch route_scratch;         // host routing (engine::route_top_k)
  // Gated DeltaNet layers: their shape, scratch (the projected rows, the conv output, the heads' outputs), the
  // step's segments (deltanet_kernels.cuh) and the state slots no sequence holds.
  bool any_deltanet = false;
  device::DeltaNetParams delta_shape;
  DeviceBuffer delta_proj, delta_mixed, delta_core, delta_segments_dev;
  PinnedBuffer delta_segments_host;
  std::vector<int32_t> free_state_slots;
  // Scratch (device).
  DeviceBuffer hidden, normed, qkv, attn, gathered, ffn, act, out, scores, arrivals, x16, x16_low, w16, logits, meta_dev, moe_dev, router_dev;
  // Gated attention (qwen3_5): the projection's rows ([query | gate] per head, k, v) and the gates split off them.
  DeviceBuffer gated_qkv, gates;
  // Gemma 4: the attention projection's rows, the dense MLP's output, the MoE block's sum of normed branches, its
  // experts' output and router input; the step's per-layer inputs (rows x layers x per_layer_input_size, from the
  // host, staged in ple_host) and the per-layer input gate's rows.
  DeviceBuffer g4_proj, g4_mlp, g4_sum, g4_moe, g4_router, ple, ple_gate;
  PinnedBuffer ple_host;
  int64_t w16_rows_cap = 0;  // elements of w16
  const int32_t* tiles_dev = nullptr;  // the step's prefill attention tiles (in meta_dev)
  // Pinned staging of transfers.
  PinnedBuffer hidden_host, meta_host, logits_host, ids_host, router_host, moe_host;
  DeviceBuffer argmax_scratch, ids_dev;
  int64_t head_pass_rows = 0;       // head rows computed (and staged) at once
  bool embed_on_device = false;     // the embedding table is the device copy of the (tied) output head
  std::vector<PinnedBuffer> expert_staging;
  std::vector<cudaEvent_t> staging_done;
  // Paged device KV, two pools of a buffer per layer (kv_buffers) with the same page ids in each of the pool's
  // layers: the full-attention layers' (VRAM account "kv": a sequence's page table covers every position it holds)
  // and the sliding-window layers' (account "kv_windowed": a sequence holds a ring of at most ring_pages pages,
  // reused once their positions left every query's window, so a long context costs those layers window-sized KV).
  // ring_pages: GpuLayers::kv_layer_pages (window + one step of rows), as the planner counts.
  std::vector<DeviceBuffer> kv_buffers;
  std::vector<device::KvRef> kv_refs;  // per layer
  int64_t pool_pages = 0, ring_pool_pages = 0, ring_pages = 0;
  int64_t full_kv_layers = 0, windowed_kv_layers = 0, widest_window = 0;
  std::vector<int32_t> free_pages, free_ring_pages;
  std::unordered_map<const void*, SequenceKv> sequences;
  uint64_t clock = 0;
  // VRAM expert tier.
  tiering::ExpertLayout expert_layout;
  // The resident blocks and the slots, each set carved from one allocation: a cudaMalloc per block rounds a 2.65 MB
  // expert up to 4 MiB (1.8 GB outside the ledger for 1245 resident experts of Qwen3-30B-A3B on an H200).
  DeviceBuffer resident_slab, slot_slab;
  std::unordered_map<int64_t, void*> resident;  // key -> block
  std::vector<void*> slots;
  std::vector<int64_t> slot_key;
  std::vector<uint64_t> slot_use;
  std::vector<cudaEvent_t> slot_free;  // recorded on the compute stream after the last use of a slot
  std::vector<cudaEvent_t> slot_ready; // recorded on the copy stream after a fill
  std::unordered_map<int64_t, int64_t> slot_of;
  // Device routing (decode of layers whose experts are all resident): a table of every (layer, expert)'s VRAM block
  // (null where not resident), the expert matrices as offsets into a block, and scratch for the routed rows.
  std::vector<bool> routes_on_device;  // per GPU layer
  // Per GPU layer: some experts resident, not all, and options.cpu_expert_rows: decode rows route on the device, the
  // VRAM experts run there (null table entries for the others) and the CPU runs the others (hybrid_decode).
  std::vector<bool> hybrid_on_device;
  PinnedBuffer hybrid_host;  // the routed ids and weights of a hybrid decode step, downloaded
  DeviceBuffer expert_table, route_ids, route_weights, routed_gate_up_out, routed_down_out;
  device::ExpertMatrixRef routed_gate_up, routed_down;
  bool device_routing = env_on("TIERLM_GPU_DEVICE_ROUTING");  // "0": always route on the host (A/B runs)
  // Hybrid placement (options.cpu_expert_rows): the engine's MoeBlock, the step's normed rows and the CPU experts'
  // sum in pinned memory, that sum in VRAM, and an event after the router's download (the shared expert runs on the
  // GPU while the host waits for it).
  engine::MoeBlock* host_moe = nullptr;
  PinnedBuffer cpu_x_host, cpu_sum_host;
  DeviceBuffer cpu_sum_dev;
  cudaEvent_t router_ready = nullptr;
  std::vector<int32_t> cpu_ids, cpu_experts_now;  // (cpu_experts_now: a hybrid decode step's distinct CPU experts)
  std::vector<float> cpu_weights;
  GpuExpertStats stats;
  uint64_t weight_bytes = 0;
  // Profiling (options.profile): an event before each operation; after the step's sync, the time to the next event
  // is added to the operation's total.
  std::vector<cudaEvent_t> marks;
  std::vector<const char*> mark_labels;
  size_t marks_used = 0;
  std::vector<std::pair<std::string, std::pair<double, uint64_t>>> profile_totals;  // label -> (ms, count)
  // (rows, head rows, one row per sequence, argmax on the device, embedding on the device) -> the step's graph
  using GraphKey = std::tuple<int64_t, int64_t, bool, bool, bool>;
  std::vector<std::pair<GraphKey, cudaGraphExec_t>> graphs;
  uint64_t profiled_steps = 0;
  cudaEvent_t step_begin = nullptr, step_end = nullptr;  // options.time_steps
  double step_ms_total = 0;
  uint64_t timed_steps = 0;
  // Diagnostic switches (environment, read once; all on by default): TIERLM_GPU_GRAPH, TIERLM_GPU_FUSED_MATVEC,
  // TIERLM_GPU_FUSED_ATTENTION ("0" turns one off), TIERLM_GPU_PDL=0 acts as options.programmatic_launch = false.
  bool use_graph = env_on("TIERLM_GPU_GRAPH"), fused_matvec = env_on("TIERLM_GPU_FUSED_MATVEC"),
       fused_attention = env_on("TIERLM_GPU_FUSED_ATTENTION");
  // TIERLM_GPU_PREFILL_ATTENTION=0: multi-row steps use the split (one query at a time) attention (A/B runs);
  // TIERLM_GPU_WARMUP=0: no warm-up at construction (to measure first-use costs).
  bool use_prefill_attention = env_on("TIERLM_GPU_PREFILL_ATTENTION"), warm = env_on("TIERLM_GPU_WARMUP");
  bool prefill_tiles = false;        // the tiled prefill attention takes this model's shape (every layer's)
  int64_t tile_cap = 0;              // rows a prefill tile holds at most (prefill_tile_rows of every layer's shape)
  int64_t step_tiles = 0;            // tiles of the current step (prefill_attention)
  static bool env_on(const char* name) {
    const char* v = std::getenv(name);
    return !(v && std::string(v) == "0");
  }

  Impl(const model::ModelWeights& weights, const GpuOptions& o, int64_t chunk, int64_t context)
      : w(weights), c(weights.config), options(o), gpu_layers(std::clamp<int64_t>(o.layers, 0, c.num_layers)),
        max_chunk(chunk), max_context(context), head(o.head && gpu_layers == c.num_layers),
        vram(o.vram_budget ? o.vram_budget : default_budget()) {
    if (!env_on("TIERLM_GPU_PDL")) options.programmatic_launch = false;
    if (!env_on("TIERLM_GPU_PACKED_MMA")) options.packed_mma = false;
    if (!env_on("TIERLM_GPU_PREFILL_MMA")) options.prefill_attention_mma = false;
    if (const char* v = std::getenv("TIERLM_GPU_SPLIT_GEMM")) options.split_gemm_activations = std::string(v) == "1";
    if (const char* v = std::getenv("TIERLM_GPU_PACKED_MMA"); v && std::string(v) == "all")
      options.packed_mma_all = true;
    if (const char* v = std::getenv("TIERLM_GPU_CPU_EXPERT_ROWS")) options.cpu_expert_rows = std::atoll(v);
    options.cpu_expert_rows = std::clamp<int64_t>(options.cpu_expert_rows, 0, max_chunk);
    if (!c.arch.mla && (c.head_dim % 16 != 0 || c.head_dim > kMaxAttentionHeadDim))
      throw std::invalid_argument(fmt::format("gpu: head_dim {} is not supported (a multiple of 16, at most {})",
                                              c.head_dim, kMaxAttentionHeadDim));
    try {
      phase_clock = std::chrono::steady_clock::now();
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
      if (options.time_steps) {
        check(cudaEventCreate(&step_begin), "event");
        check(cudaEventCreate(&step_end), "event");
      }
      check(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), "copy stream");
      setup_phase("context and streams");
      check(cublas()->create(&blas), "cublasCreate");
      check(cublas()->set_stream(blas, stream), "cublasSetStream");
      setup_phase("cuBLAS handle");
      upload_weights();
      count_kv_layers();
      setup_phase("weights upload");
      allocate_scratch();
      setup_phase("scratch");
      allocate_recurrent_states();
      if (c.arch.moe && gpu_layers > 0) setup_experts();
      setup_phase("experts");
      allocate_kv_pool();
      check(cudaDeviceSynchronize(), "setup");  // uploads and memsets (legacy stream) done before `stream` runs
      setup_phase("KV pool");
      if (warm) warm_up();
    } catch (...) {
      release_handles();  // (the buffers release themselves, and their ledger charges, as members)
      throw;
    }
  }

  ~Impl() { release_handles(); }

  // Constructor phases (setup_report): each adds the wall time since the previous one.
  std::chrono::steady_clock::time_point phase_clock;
  std::vector<std::pair<std::string, double>> setup_phases;
  // Device memory in use after each phase (cudaMemGetInfo: this process and any other), against the VRAM ledger:
  // what the CUDA context, cuBLAS and kernel images take beside the ledger's buffers.
  std::vector<std::pair<uint64_t, uint64_t>> setup_memory;  // (device bytes in use, ledger bytes)
  void setup_phase(const char* what) {
    const auto t = std::chrono::steady_clock::now();
    setup_phases.push_back({what, std::chrono::duration<double, std::milli>(t - phase_clock).count()});
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    setup_memory.push_back({uint64_t(total - free), vram.used()});
    phase_clock = t;
  }

  // Streams, events, graphs and the cuBLAS handle (after the work queued on the streams).
  void release_handles() noexcept {
    if (stream) cudaStreamSynchronize(stream);
    if (copy_stream) cudaStreamSynchronize(copy_stream);
    for (auto e : staging_done) cudaEventDestroy(e);
    if (step_begin) cudaEventDestroy(step_begin);
    if (step_end) cudaEventDestroy(step_end);
    for (auto e : marks) cudaEventDestroy(e);
    for (auto& g : graphs) cudaGraphExecDestroy(g.second);
    for (auto e : slot_free) cudaEventDestroy(e);
    for (auto e : slot_ready) cudaEventDestroy(e);
    if (router_ready) cudaEventDestroy(router_ready);
    if (blas) cublas()->destroy(blas);
    if (stream) cudaStreamDestroy(stream);
    if (copy_stream) cudaStreamDestroy(copy_stream);
    staging_done.clear(), marks.clear(), graphs.clear(), slot_free.clear(), slot_ready.clear();
    step_begin = step_end = nullptr;
    blas = nullptr;
    stream = copy_stream = nullptr;
  }

  void mark(const char* label) {
    if (!options.profile) return;
    if (marks_used == marks.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "profile event");
      marks.push_back(e);
      mark_labels.push_back(nullptr);
    }
    check(cudaEventRecord(marks[marks_used], stream), "profile mark");
    mark_labels[marks_used++] = label;
  }

  // After the stream is synchronized: folds this step's marks into the totals.
  void collect_profile() {
    if (!options.profile || marks_used == 0) return;
    for (size_t i = 0; i + 1 < marks_used; ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, marks[i], marks[i + 1]), "profile elapsed");
      auto it = std::find_if(profile_totals.begin(), profile_totals.end(),
                             [&](const auto& t) { return t.first == mark_labels[i]; });
      if (it == profile_totals.end()) it = profile_totals.insert(profile_totals.end(), {mark_labels[i], {0.0, 0}});
      it->second.first += ms;
      ++it->second.second;
    }
    marks_used = 0;
    ++profiled_steps;
  }

  void upload_weights() {
    layers.resize(size_t(gpu_layers));
    for (int64_t l = 0; l < gpu_layers; ++l) {
      const model::LayerWeights& L = w.layers[size_t(l)];
      DeviceLayer& d = layers[size_t(l)];
      d.qkv = upload(L.qkv.view, vram, "weights", options.widen_dense_weights);
      d.o = upload(L.o.view, vram, "weights", options.widen_dense_weights);
      d.gate_up = upload(L.gate_up.view, vram, "weights", options.widen_dense_weights);
      d.down = upload(L.down.view, vram, "weights", options.widen_dense_weights);
      d.router = upload(L.router.view, vram, "weights", options.widen_dense_weights);
      d.shared_gate_up = upload(L.shared_gate_up.view, vram, "weights", options.widen_dense_weights);
      d.shared_down = upload(L.shared_down.view, vram, "weights", options.widen_dense_weights);
      d.input_norm = upload_floats(L.input_norm, vram, "weights");
      d.post_norm = upload_floats(L.post_attention_norm, vram, "weights");
      d.qkv_bias = upload_floats(L.qkv_bias, vram, "weights");
      d.q_norm = upload_floats(L.q_norm, vram, "weights");
      d.k_norm = upload_floats(L.k_norm, vram, "weights");
      d.shared_expert_gate = upload_floats(L.shared_expert_gate, vram, "weights");
      d.o_bias = upload_floats(L.o_bias, vram, "weights");
      d.gate_up_bias = upload_floats(L.gate_up_bias, vram, "weights");
      d.down_bias = upload_floats(L.down_bias, vram, "weights");
      d.sinks = upload_floats(L.sinks, vram, "weights");
      const model::LayerSpec spec = c.layer(l);
      d.window = spec.mixer == model::Mixer::sliding_attention ? spec.window : 0;
      d.sparse = spec.mlp == model::Mlp::moe;
      d.expert_layer = spec.expert_layer;
      d.intermediate = spec.intermediate > 0 ? spec.intermediate : c.intermediate_size;
      d.mla = spec.mixer == model::Mixer::mla;
      d.deltanet = spec.mixer == model::Mixer::gated_deltanet;
      d.head_dim = spec.head_dim > 0 ? spec.head_dim : c.head_dim;
      d.kv_heads = spec.kv_heads > 0 ? spec.kv_heads : c.num_kv_heads;
      if (c.arch.gemma4) upload_gemma4(l, spec, L, d);
      if (d.deltanet) {
        any_deltanet = true;
        d.linear_in = upload(L.linear_in.view, vram, "weights", options.widen_dense_weights);
        d.conv = upload_floats(L.conv, vram, "weights");
        d.decay_rate = upload_floats(L.decay_rate, vram, "weights");
        d.dt_bias = upload_floats(L.dt_bias, vram, "weights");
        d.gated_norm = upload_floats(L.gated_norm, vram, "weights");
      }
      if (d.mla) {
        d.mla_in = upload(L.mla_in.view, vram, "weights", options.widen_dense_weights);
        d.q_b = upload(L.q_b.view, vram, "weights", options.widen_dense_weights);
        d.q_a_norm = upload_floats(L.q_a_norm, vram, "weights");
        d.kv_a_norm = upload_floats(L.kv_a_norm, vram, "weights");
        d.kv_b_key = upload_floats(L.kv_b_key.as<float>(), L.kv_b_key.size() / 4, vram, "weights");
        d.kv_b_value = upload_floats(L.kv_b_value.as<float>(), L.kv_b_value.size() / 4, vram, "weights");
      }
    }
    if (c.arch.mla) upload_mla_rope();
    if (head) {
      output = upload(w.output(), vram, "weights", options.widen_dense_weights);
      final_norm = upload_floats(w.final_norm, vram, "weights");
      // Tied: output() is the embedding table. Not for Gemma 4: the host scales the embedded rows and computes the
      // per-layer inputs from them (GpuStep::per_layer_inputs).
      embed_on_device = w.lm_head.view.rows == 0 && !c.arch.gemma4;
    }
    // The host's frequency table (default, linear, llama3 or YaRN: computed once, by engine::Rope) and YaRN's
    // attention factor, which engine::Rope multiplies cos and sin by (check_supported: one rope for every layer).
    engine::Rope rope(c.rope_of(0), c.head_dim);
    inv_freq = upload_floats(rope.inverse_frequencies(), vram, "weights");
    rotary_dim = 2 * int64_t(rope.inverse_frequencies().size());
    rope_scale = c.rope_of(0).type == "yarn" ? float(c.rope_of(0).attention_factor) : 1.0f;
    weight_bytes = vram.used("weights");
  }

  // Gemma 4's own weights of layer l (see DeviceLayer; check_supported has vetted the shapes).
  void upload_gemma4(int64_t l, const model::LayerSpec& spec, const model::LayerWeights& L, DeviceLayer& d) {
    d.gemma4 = true;
    d.kv_source = spec.kv_source;
    d.k_eq_v = spec.k_eq_v;
    if (int64_t(L.q_norm.size()) != d.head_dim || (d.kv_source < 0 && int64_t(L.k_norm.size()) != d.head_dim))
      throw std::invalid_argument(fmt::format("gpu: gemma4 layer {} has q/k norms of {} / {} floats, not one head ({})",
                                              l, L.q_norm.size(), L.k_norm.size(), d.head_dim));
    const engine::Rope rope(c.rope_of(l), d.head_dim);
    d.rope_inv_freq = upload_floats(rope.inverse_frequencies(), vram, "weights");
    d.rotary_dim = 2 * int64_t(rope.inverse_frequencies().size());
    d.q_scale = c.attention_scale > 0 ? float(c.attention_scale * std::sqrt(double(d.head_dim))) : 1.0f;
    d.layer_scalar = L.layer_scalar;
    d.pre_ffn_norm = upload_floats(L.pre_feedforward_norm, vram, "weights");
    d.post_ffn_norm = upload_floats(L.post_feedforward_norm, vram, "weights");
    if (d.sparse) {
      d.post_ffn_norm_1 = upload_floats(L.post_feedforward_norm_1, vram, "weights");
      d.pre_ffn_norm_2 = upload_floats(L.pre_feedforward_norm_2, vram, "weights");
      d.post_ffn_norm_2 = upload_floats(L.post_feedforward_norm_2, vram, "weights");
      d.router_scale = upload_floats(L.router_scale, vram, "weights");
    }
    if (c.per_layer_input_size > 0) {
      d.ple_gate = upload(L.per_layer_input_gate.view, vram, "weights", options.widen_dense_weights);
      d.ple_projection = upload(L.per_layer_projection.view, vram, "weights", options.widen_dense_weights);
      d.post_ple_norm = upload_floats(L.post_per_layer_input_norm, vram, "weights");
    }
  }

  int64_t widest_cols() const {
    int64_t m = std::max({c.hidden_size, c.num_heads * c.head_dim, c.max_q_rows()});
    m = std::max({m, c.intermediate_size, c.max_intermediate(), c.moe_intermediate_size,
                  c.shared_expert_intermediate_size, c.per_layer_input_size});
    if (c.arch.mla) m = std::max({m, c.num_heads * c.mla.v_head_dim, c.mla.q_lora_rank});
    if (c.any_recurrent()) m = std::max(m, c.deltanet.value_dim());  // out_proj's columns
    return m;
  }

  // MLA's RoPE turns the qk_rope_head_dim dims with the model's rope (engine::MlaAttention's Rope).
  void upload_mla_rope() {
    const model::MlaConfig& m = c.mla;
    engine::Rope rope(c.rope, m.qk_rope_head_dim);
    mla_inv_freq = upload_floats(rope.inverse_frequencies(), vram, "weights");
    device::MlaParams& p = mla_shape;
    p.heads = c.num_heads, p.nope = m.qk_nope_head_dim, p.rope = m.qk_rope_head_dim, p.lora = m.kv_lora_rank;
    p.v = m.v_head_dim;
    p.norm_eps = 1e-6f;  // q_a_layernorm / kv_a_layernorm: the RMSNorm default (runtime/engine/mla.cpp)
    p.inv_freq = mla_inv_freq.as<float>();
    p.rope_scale = c.rope.type == "yarn" ? float(c.rope.attention_factor) : 1.0f;
    p.softmax_scale = float(m.softmax_scale);
  }

  void allocate_scratch() {
    // The widest layer's attention rows (Gemma 4's full layers have their own head_dim and KV heads).
    const int64_t H = c.hidden_size, q_rows = std::max(c.num_heads * c.head_dim, c.max_q_rows());
    const int64_t kv_rows = std::max(c.num_kv_heads * c.head_dim, c.max_kv_rows());
    const int64_t F = std::max({c.intermediate_size, c.max_intermediate(), c.moe_intermediate_size,
                                c.shared_expert_intermediate_size});
    const int64_t n = max_chunk;
    // Zeroed once: warm_up() runs every GEMM shape on whatever the scratch holds, which must not be unwritten memory.
    auto floats = [&](int64_t count) {
      DeviceBuffer b(vram, "scratch", size_t(std::max<int64_t>(count, 1)) * 4);
      check(cudaMemset(b.as(), 0, b.size()), "scratch");
      return b;
    };
    hidden = floats(n * H);
    normed = floats(n * H);
    qkv = floats(n * (q_rows + 2 * kv_rows));
    if (c.arch.attention_output_gate) {
      gated_qkv = floats(n * (2 * q_rows + 2 * kv_rows));
      gates = floats(n * q_rows);
    }
    attn = floats(n * q_rows);
    gathered = floats(n * H);
    ffn = floats(n * 2 * F);
    act = floats(n * F);
    out = floats(n * H);
    if (c.arch.gemma4) {
      g4_proj = floats(n * (q_rows + 2 * kv_rows));
      g4_mlp = floats(n * H);
      if (c.arch.moe) {
        g4_sum = floats(n * H);
        g4_moe = floats(n * H);
        g4_router = floats(n * H);
      }
      if (const int64_t LP = c.num_layers * c.per_layer_input_size; LP > 0) {
        ple = floats(n * LP);
        ple_gate = floats(n * c.per_layer_input_size);
        ple_host = PinnedBuffer(options.host_ledger, size_t(n * LP) * 4);
      }
    }
    // Every attention layer's shape must take the tiled prefill attention; the split attention's scratch is sized for
    // the widest head (attention_scratch_floats grows with head_dim).
    device::QkvParams shape = attention_shape(0);
    prefill_tiles = use_prefill_attention && !c.arch.mla;
    for (int64_t l = 0; l < gpu_layers; ++l) {
      const device::QkvParams p = attention_shape(l);
      if (layers[size_t(l)].deltanet) continue;
      prefill_tiles = prefill_tiles && device::prefill_attention_supported(p);
      if (prefill_tiles)
        tile_cap = tile_cap > 0 ? std::min(tile_cap, device::prefill_tile_rows(p)) : device::prefill_tile_rows(p);
      shape.head_dim = std::max(shape.head_dim, p.head_dim);
      shape.kv_heads = std::max(shape.kv_heads, p.kv_heads);
    }
    // With tiled prefill attention, the split kernel sees only steps of at most kMaxMatvecRows rows or of one row
    // per sequence (at most max_sequences): its partial sums need no room for a whole chunk.
    const int64_t split_rows =
        prefill_tiles ? std::min(n, std::max<int64_t>(device::kMaxMatvecRows, options.max_sequences)) : n;
    scores = floats(c.arch.mla ? 1 : device::attention_scratch_floats(split_rows, shape, max_context));
    if (c.arch.mla) {
      const model::MlaConfig& m = c.mla;
      const int64_t first = m.q_lora_rank > 0 ? m.q_lora_rank : c.num_heads * m.qk_head_dim();
      mla_proj = floats(n * (first + m.latent_floats()));
      mla_qa = floats(n * m.q_lora_rank);
      mla_q = floats(n * c.num_heads * m.qk_head_dim());
      mla_q_latent = floats(n * c.num_heads * m.kv_lora_rank);
      mla_q_rope = floats(n * c.num_heads * m.qk_rope_head_dim);
      mla_out = floats(n * c.num_heads * m.v_head_dim);
      mla_split_rows = std::min(n, device::mla_split_rows(c.num_heads));
      mla_split = floats(device::mla_split_scratch_floats(mla_split_rows, mla_shape, max_context));
    }
    arrivals = DeviceBuffer(vram, "scratch", size_t(n * shape.kv_heads) * 4);
    check(cudaMemset(arrivals.as(), 0, arrivals.size()), "arrivals");
    x16 = DeviceBuffer(vram, "scratch", size_t(n * std::max(widest_cols(), int64_t(1))) * 2);
    check(cudaMemset(x16.as(), 0, x16.size()), "scratch");  // GEMM buckets read rows past n (see gemm_rows)
    if (options.split_gemm_activations || mlx_weights()) {  // MLX GEMMs split their activations (multiply)
      x16_low = DeviceBuffer(vram, "scratch", x16.size());
      check(cudaMemset(x16_low.as(), 0, x16_low.size()), "scratch");
    }
    // f16 copy of a weight's row chunk for cuBLAS: the largest matrix up to 32M elements (64 MB).
    int64_t largest = 0;
    for (int64_t l = 0; l < gpu_layers; ++l) {
      const DeviceLayer& d = layers[size_t(l)];
      for (const DeviceMatrix* m : d.matrices())
        largest = std::max(largest, m->ref.rows * m->ref.cols);
    }
    if (head) largest = std::max(largest, output.ref.rows * output.ref.cols);
    if (c.arch.moe) largest = std::max(largest, 2 * c.moe_intermediate_size * H);
    w16_rows_cap = std::min<int64_t>(largest, int64_t(32) << 20);
    // The exact configuration's MLX GEMMs dequantize into it as f32 (multiply): 4 bytes an element then.
    w16 = DeviceBuffer(vram, "scratch", size_t(w16_rows_cap) * (mlx_f32_gemm() ? 4 : 2));
    meta_host = PinnedBuffer(options.host_ledger, meta_bytes());
    meta_dev = DeviceBuffer(vram, "scratch", meta_bytes());
    hidden_host = PinnedBuffer(options.host_ledger, size_t(n * H) * 4);
    if (head) {
      // The head runs in passes of head_pass_rows rows, so the logits staging stays small on a large vocabulary
      // (a 512-row chunk of 128K logits would be 262 MB of pinned memory, and as much VRAM).
      head_pass_rows = options.head_rows_per_pass > 0
                           ? std::min(options.head_rows_per_pass, n)
                           : std::clamp<int64_t>((16ll << 20) / (c.vocab_size * 4), device::kMaxMatvecRows, n);
      logits = floats(head_pass_rows * c.vocab_size);
      logits_host = PinnedBuffer(options.host_ledger, size_t(head_pass_rows * c.vocab_size) * 4);
      argmax_scratch = DeviceBuffer(vram, "scratch", size_t(device::argmax_scratch_bytes(head_pass_rows)));
      check(cudaMemset(argmax_scratch.as(), 0, argmax_scratch.size()), "argmax scratch");
      ids_dev = DeviceBuffer(vram, "scratch", size_t(head_pass_rows) * 4);
      ids_host = PinnedBuffer(options.host_ledger, size_t(head_pass_rows) * 4);
    }
  }

  // Step metadata (int32): positions, sequence of each row, head rows, token ids (max_chunk each), the prefill
  // attention's tiles ((first row, rows) pairs: 2 x max_chunk), then the page tables of the step's sequences
  // (max_sequences x table_sets() x pages_per_context(): per sequence its full-attention table, then its ring
  // table, where the model has such layers).
  static constexpr int64_t kMetaRowArrays = 6;
  int64_t pages_per_context() const { return (max_context + device::kKvPage - 1) / device::kKvPage; }
  int64_t table_sets() const { return std::max<int64_t>(1, (full_kv_layers > 0) + (windowed_kv_layers > 0)); }
  size_t meta_ints() const {
    return size_t(kMetaRowArrays * max_chunk + options.max_sequences * table_sets() * pages_per_context());
  }
  size_t meta_bytes() const { return meta_ints() * 4; }

  int kv_codec_code() const {  // device::KvRef::codec
    return options.kv_codec == GpuKvCodec::q8 ? 1 : options.kv_codec == GpuKvCodec::f32 ? 2 : 0;
  }

  // Device KV bytes of one page of layer l (its own KV heads and head_dim; 0 for a KV-shared layer).
  uint64_t kv_page_bytes(int64_t l) const {
    if (c.arch.mla)  // the latent row: kv_lora_rank + rope values a position (f16, or f32 in exact mode)
      return uint64_t(device::kKvPage * device::latent_row_bytes(kv_codec_code(), c.mla.latent_floats()));
    const DeviceLayer& d = layers[size_t(l)];
    if (d.deltanet || d.kv_source >= 0) return 0;
    const bool q8 = options.kv_codec == GpuKvCodec::q8;
    const uint64_t rows = uint64_t(device::kKvPage * d.kv_heads);
    uint64_t bytes = 2 * rows * uint64_t(device::kv_row_bytes(kv_codec_code(), d.head_dim));
    if (q8) bytes += 2 * rows * uint64_t(d.head_dim / device::q8_block(d.head_dim)) * 4;
    return bytes;
  }

  // Gated DeltaNet layers: the states of max_sequences sequences per layer (ledger account "kv", as the CPU's
  // KVCache charges its states), zeroed; a sequence takes a slot when the device first sees it and gives it back
  // when dropped. Before the KV pool, which the VRAM left over sizes.
  void allocate_recurrent_states() {
    if (!any_deltanet) return;
    const model::DeltaNetConfig& dn = c.deltanet;
    device::DeltaNetParams& p = delta_shape;
    p.conv_dim = dn.conv_dim(), p.kernel = dn.conv_kernel, p.key_heads = dn.key_heads;
    p.value_heads = dn.value_heads, p.key_head_dim = dn.key_head_dim, p.value_head_dim = dn.value_head_dim;
    p.eps = float(c.rms_norm_eps);
    for (DeviceLayer& d : layers)
      if (d.deltanet) {
        d.state = DeviceBuffer(vram, "kv", size_t(options.max_sequences * p.slot_floats()) * 4);
        check(cudaMemset(d.state.as(), 0, d.state.size()), "recurrent state");
      }
    for (int32_t s = int32_t(options.max_sequences) - 1; s >= 0; --s) free_state_slots.push_back(s);
    const int64_t n = max_chunk;
    delta_proj = DeviceBuffer(vram, "scratch", size_t(n * p.projected_width()) * 4);
    delta_mixed = DeviceBuffer(vram, "scratch", size_t(n * p.conv_dim) * 4);
    delta_core = DeviceBuffer(vram, "scratch", size_t(n * p.value_dim()) * 4);
    // GEMM buckets write and read rows past n (see gemm_rows): never unwritten memory.
    check(cudaMemset(delta_proj.as(), 0, delta_proj.size()), "scratch");
    check(cudaMemset(delta_core.as(), 0, delta_core.size()), "scratch");
    const size_t segment_bytes = size_t(device::deltanet_segment_ints(options.max_sequences)) * 4;
    delta_segments_dev = DeviceBuffer(vram, "scratch", segment_bytes);
    check(cudaMemset(delta_segments_dev.as(), 0, delta_segments_dev.size()), "scratch");
    delta_segments_host = PinnedBuffer(options.host_ledger, segment_bytes);
  }

  // Which GPU layers keep a ring (sliding window) and how many pages it takes; before the scratch (meta_ints).
  void count_kv_layers() {
    for (const DeviceLayer& d : layers) {
      // No pages: a Gated DeltaNet layer's states are apart (allocate_recurrent_states); a KV-shared layer reads its
      // source layer's pages (same kind, so its page table is there).
      if (d.deltanet || d.kv_source >= 0) continue;
      if (d.window == 0) {
        ++full_kv_layers;
        continue;
      }
      ++windowed_kv_layers;
      widest_window = std::max(widest_window, d.window);
      ring_pages = std::max(ring_pages, GpuLayers::kv_layer_pages(d.window, max_context, max_chunk));
    }
  }

  void allocate_kv_pool() {
    if (gpu_layers == 0) return;
    const int64_t per_context = pages_per_context();
    // One sequence of max_context positions: its full-attention pages and its ring, each layer its own page size.
    uint64_t sequence_bytes = 0;
    for (int64_t l = 0; l < gpu_layers; ++l)
      sequence_bytes += kv_page_bytes(l) * uint64_t(layers[size_t(l)].window > 0 ? ring_pages : per_context);
    if (options.kv_pages > 0) {
      pool_pages = options.kv_pages;
      ring_pool_pages = std::min(options.kv_pages, options.max_sequences * ring_pages);
    } else {
      const uint64_t margin = 64ull << 20;  // cuBLAS workspace, graphs, fragmentation
      const uint64_t used = vram.used(), budget = vram.budget();
      const double fit = budget > used + margin ? double(budget - used - margin) / double(sequence_bytes) : 0.0;
      if (fit < 1.0)
        throw tiering::LedgerError(fmt::format(
            "gpu: the VRAM budget ({} MiB, {} MiB taken by weights, experts and scratch) leaves room for {:.2f} "
            "sequences' device KV; one sequence of {} positions needs {} MiB ({} pages of {} positions on {} "
            "full-attention layers, a ring of {} on {} sliding-window layers) (put fewer layers on the GPU, use the "
            "q8 device KV, or shorten the context)",
            budget >> 20, used >> 20, fit, max_context, sequence_bytes >> 20, per_context, device::kKvPage,
            full_kv_layers, ring_pages, windowed_kv_layers));
      const double sequences = std::min(double(options.max_sequences), fit);
      pool_pages = int64_t(sequences * double(per_context));
      ring_pool_pages = int64_t(sequences * double(ring_pages));
    }
    if (full_kv_layers == 0) pool_pages = 0;
    if (windowed_kv_layers == 0) ring_pool_pages = 0;
    const bool q8 = options.kv_codec == GpuKvCodec::q8;

    // Zeroed: an attention chunk may read (and weigh 0) ring positions no step wrote yet, which must not be NaN.
    auto buffer = [&](const char* account, size_t bytes) -> void* {
      kv_buffers.emplace_back(vram, account, bytes);
      check(cudaMemset(kv_buffers.back().as(), 0, kv_buffers.back().size()), "kv pool");
      return kv_buffers.back().as();
    };
    latent_refs.resize(size_t(gpu_layers));
    for (int64_t l = 0; l < gpu_layers; ++l) {
      if (c.arch.mla) {  // full attention over the latent rows: the first pool
        latent_refs[size_t(l)] = {buffer("kv", size_t(pool_pages) * kv_page_bytes(l)), kv_codec_code()};
        kv_refs.push_back({});
        continue;
      }
      if (layers[size_t(l)].deltanet) {  // no pages: its states are apart (allocate_recurrent_states)
        kv_refs.push_back({});
        continue;
      }
      const DeviceLayer& d = layers[size_t(l)];
      if (d.kv_source >= 0) {  // Gemma 4's KV-shared layers read their source's (an earlier layer of the same kind)
        kv_refs.push_back(kv_refs[size_t(d.kv_source)]);
        continue;
      }
      const bool ring = d.window > 0;
      const char* account = ring ? "kv_windowed" : "kv";
      const size_t rows = size_t((ring ? ring_pool_pages : pool_pages) * device::kKvPage * d.kv_heads);
      const size_t row_bytes = size_t(device::kv_row_bytes(kv_codec_code(), d.head_dim));
      const size_t blocks = size_t(d.head_dim / device::q8_block(d.head_dim));
      device::KvRef r;
      r.codec = kv_codec_code();
      r.keys = buffer(account, rows * row_bytes);
      r.values = buffer(account, rows * row_bytes);
      if (q8) {
        r.key_scales = static_cast<float*>(buffer(account, rows * blocks * 4));
        r.value_scales = static_cast<float*>(buffer(account, rows * blocks * 4));
      }
      kv_refs.push_back(r);
    }
    free_pages.resize(size_t(pool_pages));
    std::iota(free_pages.rbegin(), free_pages.rend(), 0);  // page 0 is taken first
    free_ring_pages.resize(size_t(ring_pool_pages));
    std::iota(free_ring_pages.rbegin(), free_ring_pages.rend(), 0);
  }

  void setup_experts() {
    if (!w.experts) throw std::invalid_argument("gpu: MoE model without an expert tier");
    expert_layout = w.experts->store().layout();
    const int64_t E = c.num_experts;
    const size_t stride = (expert_layout.bytes + 255) / 256 * 256;
    std::vector<std::pair<int64_t, int64_t>> keep;  // (layer, expert), each once
    std::unordered_set<int64_t> seen;
    for (const auto& [layer, expert] : options.resident_experts) {
      if (layer < 0 || layer >= gpu_layers || expert < 0 || expert >= E || !layers[size_t(layer)].sparse) continue;
      if (seen.insert(layer * E + expert).second) keep.emplace_back(layer, expert);
    }
    if (!keep.empty()) resident_slab = DeviceBuffer(vram, "resident_experts", keep.size() * stride);
    for (size_t i = 0; i < keep.size(); ++i) {
      const auto [layer, expert] = keep[i];
      void* block = resident_slab.as<char>() + i * stride;
      fill_block_sync(layers[size_t(layer)].expert_layer, expert, block);
      resident.emplace(layer * E + expert, block);
    }
    const int64_t want = options.expert_slots > 0 ? options.expert_slots : 4 * c.num_experts_per_tok;
    const int64_t count = std::max<int64_t>(want, c.num_experts_per_tok);
    slot_slab = DeviceBuffer(vram, "expert_cache", size_t(count) * stride);
    for (int64_t s = 0; s < count; ++s) {
      slots.push_back(slot_slab.as<char>() + size_t(s) * stride);
      slot_key.push_back(-1);
      slot_use.push_back(0);
      cudaEvent_t a, b;
      check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "event");
      check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "event");
      slot_free.push_back(a);
      slot_ready.push_back(b);
    }
    for (int s = 0; s < 4; ++s) {
      expert_staging.emplace_back(options.host_ledger, expert_layout.bytes);
      cudaEvent_t e;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
      staging_done.push_back(e);
    }
    router_dev = DeviceBuffer(vram, "scratch", size_t(max_chunk * E) * 4);
    router_host = PinnedBuffer(options.host_ledger, size_t(max_chunk * E) * 4);
    // Per layer: row index and weight of every (row, choice), grouped by expert.
    const size_t route = size_t(max_chunk * c.num_experts_per_tok) * 8;
    moe_dev = DeviceBuffer(vram, "scratch", route);
    moe_host = PinnedBuffer(options.host_ledger, route);
    check(cudaEventCreateWithFlags(&router_ready, cudaEventDisableTiming), "event");
    if (const int64_t rows = options.cpu_expert_rows; rows > 0) {
      cpu_x_host = PinnedBuffer(options.host_ledger, size_t(rows * c.hidden_size) * 4);
      cpu_sum_host = PinnedBuffer(options.host_ledger, size_t(rows * c.hidden_size) * 4);
      cpu_sum_dev = DeviceBuffer(vram, "scratch", size_t(rows * c.hidden_size) * 4);
      cpu_ids.reserve(size_t(rows * c.num_experts_per_tok));
      cpu_weights.reserve(size_t(rows * c.num_experts_per_tok));
      cpu_experts_now.reserve(size_t(rows * c.num_experts_per_tok));
    }
    setup_device_routing();
  }

  // Layers whose experts are all resident route decode rows on the device, when the kernels take the format.
  void setup_device_routing() {
    const int64_t E = c.num_experts, k = c.num_experts_per_tok;
    routes_on_device.assign(size_t(gpu_layers), false);
    hybrid_on_device.assign(size_t(gpu_layers), false);
    // gpt-oss's router bias, expert biases and clamped SwiGLU are not in the device routing kernels: host routing.
    // Nor are DeepSeek's routers (sigmoid scores, score-correction bias, group limits, routed scaling).
    const model::RouterConfig& router = c.router;
    const bool plain_router = router.scoring == model::RouterConfig::Scoring::softmax &&
                              router.groups == model::RouterConfig::Groups::none && !router.score_correction_bias &&
                              router.routed_scaling_factor == 1.0;
    // Nor are Gemma 4's (its router input, per_expert_scale, GeGLU experts).
    if (!device_routing || resident.empty() || c.arch.gpt_oss || c.arch.gemma4 || !plain_router) return;
    const char* some = static_cast<const char*>(resident.begin()->second);
    const tiering::ExpertViews v = expert_layout.views(some);
    auto as_offsets = [&](const kernels::WeightView& m) {
      device::ExpertMatrixRef r;
      r.shape = matrix_ref(m, nullptr, nullptr, nullptr);
      r.data = uint64_t(static_cast<const char*>(m.data) - some);
      r.scales = m.scales ? uint64_t(static_cast<const char*>(m.scales) - some) : 0;
      r.has_biases = m.biases != nullptr && m.format != kernels::WeightFormat::q8_0;
      r.biases = r.has_biases ? uint64_t(static_cast<const char*>(m.biases) - some) : 0;
      return r;
    };
    routed_gate_up = as_offsets(v.gate_up);
    routed_down = as_offsets(v.down);
    if (!device::experts_routable(routed_gate_up, routed_down, E, k)) return;
    std::vector<const void*> table(size_t(gpu_layers * E), nullptr);
    bool any = false;
    for (int64_t l = 0; l < gpu_layers; ++l) {
      if (!layers[size_t(l)].sparse) {
        routes_on_device[size_t(l)] = true;  // a dense layer needs no routing (host_free below)
        continue;
      }
      bool all = true, some_resident = false;
      for (int64_t e = 0; e < E; ++e) {
        const auto it = resident.find(l * E + e);
        if (it == resident.end()) {
          all = false;
        } else {
          table[size_t(l * E + e)] = it->second;
          some_resident = true;
        }
      }
      routes_on_device[size_t(l)] = all;
      hybrid_on_device[size_t(l)] = !all && some_resident && options.cpu_expert_rows > 0;
      any |= all || hybrid_on_device[size_t(l)];
    }
    if (!any) return;
    expert_table = DeviceBuffer(vram, "scratch", table.size() * sizeof(void*));
    check(cudaMemcpy(expert_table.as(), table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice),
          "expert table");
    const int64_t slots = device::kMaxMatvecRows * k;  // (row, choice) pairs of the largest routed step
    route_ids = DeviceBuffer(vram, "scratch", size_t(slots) * 4);
    route_weights = DeviceBuffer(vram, "scratch", size_t(slots) * 4);
    routed_gate_up_out = DeviceBuffer(vram, "scratch", size_t(slots * routed_gate_up.shape.rows) * 4);
    routed_down_out = DeviceBuffer(vram, "scratch", size_t(slots * routed_down.shape.rows) * 4);
    if (std::find(hybrid_on_device.begin(), hybrid_on_device.end(), true) != hybrid_on_device.end())
      hybrid_host = PinnedBuffer(options.host_ledger, size_t(slots) * 8);
  }

  // Host block of an expert (from the host expert cache: resident, cached, or read from NVMe now).
  const void* host_block(const tiering::ExpertViews& v) const {
    return static_cast<const char*>(v.gate_up.data) - expert_layout.parts[0].offset;
  }

  // `layer`: the expert tier's layer index (LayerSpec::expert_layer).
  void fill_block_sync(int64_t layer, int64_t expert, void* device_block) {
    tiering::ExpertCache& cache = w.experts->cache();
    const int32_t e = int32_t(expert);
    cache.request(layer, std::span(&e, 1));
    const tiering::ExpertViews v = cache.acquire(layer, e);
    check(cudaMemcpy(device_block, host_block(v), expert_layout.bytes, cudaMemcpyHostToDevice), "expert upload");
    cache.release(layer, e);
    stats.bytes_copied += expert_layout.bytes;
  }

  // One prefill step and the decode steps a first prompt takes, on a sequence of its own, forgotten afterwards: the
  // kernels load (CUDA loads a module's kernels lazily, on first launch), cuBLAS picks and loads its kernels for the
  // prefill shapes and sizes its workspace, and the decode graphs (greedy and logits) are captured, here rather
  // than in the first prompt. Dense models only: a MoE step would route experts through the host expert cache.
  void warm_up() {
    if (gpu_layers == 0 || c.arch.moe) return;
    const void* key = this;
    const int64_t n = std::min<int64_t>({max_chunk, max_context, 64});
    std::vector<int32_t> tokens(size_t(n), 0);
    std::vector<int64_t> positions(static_cast<size_t>(n));
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<const void*> sequence(size_t(n), key);
    std::vector<float> hidden_rows(size_t(n * c.hidden_size), 0.0f), logits_row(head ? size_t(c.vocab_size) : 0);
    std::vector<float> per_layer_inputs(size_t(n * c.num_layers * c.per_layer_input_size), 0.0f);  // Gemma 4
    float* logits_out = logits_row.data();
    int32_t greedy = 0, last_row = 0;
    auto step = [&](int64_t rows, int64_t first_position, bool logits) {
      GpuStep s;
      s.hidden = hidden_rows.data();
      s.rows = rows;
      s.per_layer_inputs = per_layer_inputs;
      s.tokens = std::span(tokens.data(), size_t(rows));
      s.sequence = std::span(sequence.data(), size_t(rows));
      std::iota(positions.begin(), positions.begin() + rows, first_position);
      s.positions = std::span(positions.data(), size_t(rows));
      last_row = int32_t(rows - 1);
      if (head) {
        s.head_rows = std::span(&last_row, 1);
        if (logits)
          s.head_out = std::span(&logits_out, 1);
        else
          s.head_argmax = std::span(&greedy, 1);
      }
      run(s);
    };
    const GpuExpertStats kept = stats;
    // Every GEMM shape of the layers (and of the head's passes) once, on whatever the scratch holds.
    // (The attention matrices of the first attention layer: a Gated DeltaNet layer has none; its own shapes warm up
    // in the step below.)
    const auto attention = std::find_if(layers.begin(), layers.end(), [](const DeviceLayer& x) { return !x.deltanet; });
    const DeviceLayer& d = attention != layers.end() ? *attention : layers[0];
    int64_t head_warmed = 0;
    for (int64_t rows = device::kMaxMatvecRows + 1; rows <= max_chunk;) {
      const int64_t b = gemm_rows(rows, max_chunk);
      // o and down accumulate into the hidden state (beta 1: cuBLAS's first call of that kind costs ~4 ms too).
      if (!d.deltanet) {
        multiply(d.qkv.ref, normed.as<float>(), b, qkv.as<float>(), d.qkv.ref.rows, false);
        multiply(d.o.ref, attn.as<float>(), b, out.as<float>(), c.hidden_size, true);
      }
      multiply(d.gate_up.ref, normed.as<float>(), b, ffn.as<float>(), d.gate_up.ref.rows, false);
      multiply(d.down.ref, act.as<float>(), b, out.as<float>(), c.hidden_size, true);
      if (head && std::min(b, head_pass_rows) > device::kMaxMatvecRows &&
          gemm_rows(std::min(b, head_pass_rows), head_pass_rows) > head_warmed) {
        head_warmed = gemm_rows(std::min(b, head_pass_rows), head_pass_rows);
        multiply(output.ref, normed.as<float>(), head_warmed, logits.as<float>(), c.vocab_size, false, head_pass_rows);
      }
      if (!gemm_buckets) break;
      rows = b + 1;
    }
    check(cudaStreamSynchronize(stream), "warm-up GEMMs");
    step(n, 0, false);
    if (max_context > n + 2) {
      step(1, n, false);
      step(1, n + 1, true);
    }
    drop(sequences.find(key));
    stats = kept;
    profile_totals.clear();
    profiled_steps = 0;
    step_ms_total = 0;
    timed_steps = 0;
    setup_phase("warm-up");
  }

  // ---- matrix products -----------------------------------------------------------------------------------
  // Rows a GEMM of n rows computes: n rounded up to the next of a fixed set of sizes (at most `cap`, the rows the
  // output buffer holds), so that cuBLAS sees a bounded set of shapes, all of which warm_up() has run once: a new
  // shape costs a kernel choice and possibly a kernel load (~ms) in the middle of a prompt. The extra rows read
  // stale activations and write output rows past n, which no one reads (each output row depends on its input row
  // only). TIERLM_GPU_GEMM_BUCKETS=0: exactly n.
  int64_t gemm_rows(int64_t n, int64_t cap) const {
    if (!gemm_buckets) return n;
    for (int64_t b : kGemmBuckets)
      if (b >= n) return std::min(b, cap);
    return n <= cap ? std::max(n, std::min(cap, (n + 1023) / 1024 * 1024)) : n;
  }
  static constexpr int64_t kGemmBuckets[] = {8,   16,  24,  32,   48,   64,   96,   128,  192,  256,
                                             320, 384, 512, 640,  768,  1024, 1280, 1536, 1792, 2048};
  bool gemm_buckets = env_on("TIERLM_GPU_GEMM_BUCKETS");

  // MLX's semantics are f32 activations (runtime/kernels/affine_f32.h). The decode matvecs keep them (f32 x, or
  // the tensor-core kernel's hi/lo f16 halves, ~2^-22 of |x|). A multi-row step's f16 tensor-core GEMM rounded the
  // activations to f16, which moved qwen3_5_moe-mlx4's prompt logits by 0.225 (its routers flip; H100). So an MLX
  // weight's GEMM always takes its activations in two f16 parts (split_f16.cuh: ~22 bits, two GEMMs; that fixture
  // 8e-4, the others <= 2.6e-3 with the weights' f16 rounding left), and in the exact configuration
  // (widen_dense_weights) runs in f32: row chunks dequantized to f32, cuBLAS SGEMM (<= 1.8e-5 from transformers).
  bool mlx_f32_gemm() const { return options.widen_dense_weights; }
  static bool is_mlx(const device::MatrixRef& m) {
    return m.format == int(kernels::WeightFormat::mlx_q4) || m.format == int(kernels::WeightFormat::mlx_q8);
  }
  // Whether any GPU matrix is MLX (the layers' and the head's, after upload_weights; an MLX folder's experts).
  bool mlx_weights() const {
    for (const DeviceLayer& d : layers)
      for (const DeviceMatrix* m : d.matrices())
        if (is_mlx(m->ref)) return true;
    return is_mlx(output.ref) || (c.arch.moe && c.quantization.has_value());
  }

  // y[i] (+)= W x[i] for i < n (the output buffer holds max_rows rows, max_chunk when 0).
  void multiply(const device::MatrixRef& m, const float* x, int64_t n, float* y, int64_t ldy, bool accumulate,
                int64_t max_rows = 0) {
    if (n <= device::kMaxMatvecRows || m.format == device::kMxfp4Format) {  // MXFP4: read packed at any n
      device::matvec(m, x, m.cols, n, y, ldy, accumulate, stream);
      return;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (mlx_f32_gemm() && is_mlx(m)) {  // MLX weights, exact configuration: f32 GEMMs on f32 row chunks
      const int64_t chunk = std::max<int64_t>(16, int64_t(w16.size() / 4) / m.cols / 16 * 16);
      for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
        const int64_t count = std::min(chunk, m.rows - r0);
        device::dequantize_f32(m, r0, count, w16.as<float>(), stream);
        check(cublas()->gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(count), int(n), int(m.cols), &alpha, w16.as(),
                                CUDA_R_32F, int(m.cols), x, CUDA_R_32F, int(m.cols), &beta, y + r0, CUDA_R_32F,
                                int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx f32 (MLX)");
      }
      return;
    }
    if (m.format == 0) {  // f32 weights: an f32 GEMM (no f16 rounding of weights or activations)
      check(cublas()->gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(m.rows), int(n), int(m.cols), &alpha, m.data,
                              CUDA_R_32F, int(m.cols), x, CUDA_R_32F, int(m.cols), &beta, y, CUDA_R_32F, int(ldy),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx f32");
      return;
    }
    const bool split = options.split_gemm_activations || is_mlx(m);
    if (split)
      device::to_f16_split(x, n * m.cols, x16.as(), x16_low.as(), stream);
    else
      device::to_f16(x, n * m.cols, x16.as(), stream);
    n = gemm_rows(n, max_rows > 0 ? max_rows : max_chunk);
    // Packed weights are dequantized in whole 16-row panels.
    const int64_t chunk = m.format == 1 ? m.rows : std::max<int64_t>(16, w16_rows_cap / m.cols / 16 * 16);
    for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
      const int64_t count = std::min(chunk, m.rows - r0);
      const void* a;
      if (m.format == 1) {
        a = static_cast<const uint16_t*>(m.data) + r0 * m.cols;
      } else {
        device::dequantize_f16(m, r0, count, w16.as(), stream);
        a = w16.as();
      }
      check(cublas()->gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(count), int(n), int(m.cols), &alpha, a, CUDA_R_16F,
                         int(m.cols), x16.as(), CUDA_R_16F, int(m.cols), &beta, y + r0, CUDA_R_32F, int(ldy),
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
      if (split) {  // + W x_low / kSplitLowScale
        const float low_alpha = 1.0f / device::kSplitLowScale, one = 1.0f;
        check(cublas()->gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(count), int(n), int(m.cols), &low_alpha, a,
                                CUDA_R_16F, int(m.cols), x16_low.as(), CUDA_R_16F, int(m.cols), &one, y + r0,
                                CUDA_R_32F, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx (low part)");
      }
    }
  }

  // ---- device KV ------------------------------------------------------------------------------------------
  // Drops the least recently used sequence outside `batch` (its pages go back to the pool); false when none is.
  bool drop_one(const std::vector<const void*>& batch) {
    auto victim = sequences.end();
    for (auto it = sequences.begin(); it != sequences.end(); ++it)
      if (std::find(batch.begin(), batch.end(), it->first) == batch.end() &&
          (victim == sequences.end() || it->second.last_use < victim->second.last_use))
        victim = it;
    if (victim == sequences.end()) return false;
    drop(victim);
    return true;
  }

  // Gives a sequence's pages back to the pools (taken again first, in their order) and forgets it.
  void drop(std::unordered_map<const void*, SequenceKv>::iterator it) {
    free_pages.insert(free_pages.end(), it->second.pages.rbegin(), it->second.pages.rend());
    if (it->second.state_slot >= 0) free_state_slots.push_back(it->second.state_slot);
    free_ring_pages.insert(free_ring_pages.end(), it->second.ring.rbegin(), it->second.ring.rend());
    sequences.erase(it);
  }

  // The sequence's KV, with pages for positions [0, end) (its ring: at most ring_pages). Called with the stream idle
  // (no kernel reads a page that changes hands).
  SequenceKv& sequence_kv(const void* key, int64_t end, const std::vector<const void*>& batch) {
    auto it = sequences.find(key);
    if (it == sequences.end()) {
      while (int64_t(sequences.size()) >= options.max_sequences)
        if (!drop_one(batch)) throw std::invalid_argument("gpu: more sequences in one step than max_sequences");
      it = sequences.emplace(key, SequenceKv{}).first;
      if (any_deltanet) {  // fewer sequences than max_sequences (above): a slot is free
        it->second.state_slot = free_state_slots.back();
        free_state_slots.pop_back();
      }
    }
    SequenceKv& s = it->second;
    s.last_use = ++clock;
    const int64_t need = (end + device::kKvPage - 1) / device::kKvPage;
    auto take = [&](std::vector<int32_t>& held, int64_t want, std::vector<int32_t>& free, int64_t pool,
                    const char* which) {
      while (int64_t(held.size()) < want) {
        if (free.empty() && !drop_one(batch))
          throw std::runtime_error(fmt::format("gpu: the device KV pool of the {} layers is exhausted ({} pages of "
                                               "{} positions, all held by the {} sequences of this step)",
                                               which, pool, device::kKvPage, batch.size()));
        held.push_back(free.back());
        free.pop_back();
      }
    };
    if (full_kv_layers > 0) take(s.pages, need, free_pages, pool_pages, "full-attention");
    if (windowed_kv_layers > 0)
      take(s.ring, std::min(need, ring_pages), free_ring_pages, ring_pool_pages, "sliding-window");
    return s;
  }

  // Whether a step may write `s` from position `first` on when it wrote past it before (a reused prefix): a
  // sliding-window layer needs the window that ends at `first`, whose pages later positions may have taken over
  // in the ring (the ring holds pages (last - ring_pages, last] of the furthest position written).
  bool ring_holds(const SequenceKv& s, int64_t first) const {
    if (windowed_kv_layers == 0 || first == 0) return true;
    const int64_t last = (std::max(s.written, first) - 1) / device::kKvPage;
    const int64_t first_needed = std::max<int64_t>(0, first - widest_window + 1) / device::kKvPage;
    return first_needed > last - ring_pages;
  }

  // Writes sequence b's page tables for positions [0, end) into the step's metadata (see meta_ints).
  void write_tables(const SequenceKv& s, int64_t end, int32_t* tables) const {
    const int64_t need = (end + device::kKvPage - 1) / device::kKvPage;
    if (full_kv_layers > 0) {
      std::copy(s.pages.begin(), s.pages.begin() + need, tables);
      tables += pages_per_context();
    }
    if (windowed_kv_layers > 0)
      for (int64_t i = 0; i < need; ++i) tables[i] = s.ring[size_t(i % ring_pages)];
  }

  // ---- one step -------------------------------------------------------------------------------------------
  void run(const GpuStep& step) {
    const int64_t n = step.rows;
    if (n <= 0 || n > max_chunk) throw std::invalid_argument("gpu: batch rows outside [1, max_chunk]");
    if (int64_t(step.sequence.size()) < n || int64_t(step.positions.size()) < n)
      throw std::invalid_argument("gpu: sequence/position spans shorter than the batch");
    const bool device_embed = embed_on_device && int64_t(step.tokens.size()) >= n;
    if (!device_embed && !step.hidden) throw std::invalid_argument("gpu: a step without embedded rows or token ids");
    if (!head && !step.hidden) throw std::invalid_argument("gpu: a step that ends on the host needs hidden rows");
    const int64_t ple_width = c.arch.gemma4 && gpu_layers > 0 ? c.num_layers * c.per_layer_input_size : 0;
    if (ple_width > 0 && int64_t(step.per_layer_inputs.size()) < n * ple_width)
      throw std::invalid_argument(
          "gpu: a gemma4 step without its rows' per-layer inputs (hidden_size_per_layer_input)");
    const int64_t head_count = head ? int64_t(step.head_rows.size()) : 0;
    const bool argmax = head_count > 0 && !step.head_argmax.empty();
    if (head_count > 0 && ((!step.head_out.empty() && int64_t(step.head_out.size()) < head_count) ||
                           (argmax && int64_t(step.head_argmax.size()) < head_count) ||
                           (step.head_out.empty() && !argmax)))
      throw std::invalid_argument("gpu: head outputs do not match the head rows");
    for (int64_t i = 0; i < head_count; ++i)
      if (step.head_rows[size_t(i)] < 0 || step.head_rows[size_t(i)] >= n)
        throw std::invalid_argument("gpu: a head row outside the step");
    const int64_t H = c.hidden_size;
    // Metadata: one pinned block, one copy.
    check(cudaStreamSynchronize(stream), "sync before staging");  // the pinned staging is free again
    int32_t* ints = meta_host.as<int32_t>();
    int32_t* pos = ints;
    int32_t* cache_of_row = ints + max_chunk;
    int32_t* heads = ints + 2 * max_chunk;
    int32_t* token_ids = ints + 3 * max_chunk;
    int32_t* tables = ints + kMetaRowArrays * max_chunk;
    const int64_t stride = pages_per_context(), sets = table_sets();
    std::vector<const void*> batch;
    for (int64_t i = 0; i < n; ++i) {
      if (step.positions[size_t(i)] < 0 || step.positions[size_t(i)] >= max_context)
        throw std::out_of_range("gpu: position beyond the device KV capacity");
      pos[i] = int32_t(step.positions[size_t(i)]);
      auto at = std::find(batch.begin(), batch.end(), step.sequence[size_t(i)]);
      if (at == batch.end()) {
        batch.push_back(step.sequence[size_t(i)]);
        at = batch.end() - 1;
      }
      cache_of_row[i] = int32_t(at - batch.begin());
    }
    if (device_embed)
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = step.tokens[size_t(i)];
        if (t < 0 || t >= c.vocab_size) throw std::out_of_range("gpu: token id outside the vocabulary");
        token_ids[i] = t;
      }
    if (int64_t(batch.size()) > options.max_sequences)
      throw std::invalid_argument("gpu: " + std::to_string(batch.size()) + " sequences in one step, more than max_sequences (" +
                                  std::to_string(options.max_sequences) + ")");
    device::set_programmatic_launch(options.programmatic_launch);
    device::set_dense_rows_per_block(fused_matvec ? options.dense_rows_per_block : -1);
    device::set_packed_mma(options.packed_mma, options.packed_mma_all);
    device::set_prefill_attention_mma(options.prefill_attention_mma);
    for (size_t b = 0; b < batch.size() && gpu_layers > 0; ++b) {
      int64_t first = max_context, last = -1;
      for (int64_t i = 0; i < n; ++i)
        if (cache_of_row[i] == int32_t(b)) {
          first = std::min<int64_t>(first, pos[i]);
          last = std::max<int64_t>(last, pos[i]);
        }
      const auto known = sequences.find(batch[b]);
      const int64_t held = known == sequences.end() ? 0 : known->second.filled;
      if (first > held)
        throw std::logic_error("gpu: a step writes a sequence from position " + std::to_string(first) +
                               " but the device holds only positions [0, " + std::to_string(held) +
                               ") of it (its device KV was dropped; reuse at most cached_positions())");
      if (any_deltanet && first != 0 && first != held)
        throw std::logic_error("gpu: a step writes a sequence from position " + std::to_string(first) +
                               " but its Gated DeltaNet states on the device hold positions [0, " +
                               std::to_string(held) + "): recurrent states cannot skip or rewind (start at 0 or " +
                               std::to_string(held) + ")");
      if (known != sequences.end() && !ring_holds(known->second, first))
        throw std::logic_error(fmt::format("gpu: a step writes a sequence from position {}, but its sliding-window "
                                           "layers' ring has moved on to position {} and no longer holds the window "
                                           "of {} positions ending there",
                                           first, known->second.written, widest_window));
      SequenceKv& s = sequence_kv(batch[b], last + 1, batch);
      s.filled = last + 1;
      s.written = std::max(s.written, s.filled);
      write_tables(s, last + 1, tables + int64_t(b) * sets * stride);
    }
    const bool one_row_per_sequence = int64_t(batch.size()) == n;  // decode: attention may do the rope/KV store
    if (any_deltanet && gpu_layers > 0) stage_deltanet_segments(n, pos, cache_of_row, batch);
    // Prefill attention's tiles: runs of consecutive rows of one sequence, at most prefill_tile_rows each.
    step_tiles = 0;
    if (prefill_tiles && n > device::kMaxMatvecRows) {
      int32_t* tiles = ints + 4 * max_chunk;
      const int64_t cap = tile_cap;
      for (int64_t i = 0; i < n; ++i) {
        if (step_tiles == 0 || cache_of_row[i] != cache_of_row[tiles[2 * (step_tiles - 1)]] ||
            tiles[2 * (step_tiles - 1) + 1] == cap) {
          tiles[2 * step_tiles] = int32_t(i);
          tiles[2 * step_tiles + 1] = 0;
          ++step_tiles;
        }
        ++tiles[2 * (step_tiles - 1) + 1];
      }
    }
    for (int64_t i = 0; i < head_count; ++i) heads[i] = step.head_rows[size_t(i)];
    if (!device_embed) std::memcpy(hidden_host.as(), step.hidden, size_t(n * H) * 4);
    if (ple_width > 0) std::memcpy(ple_host.as(), step.per_layer_inputs.data(), size_t(n * ple_width) * 4);
    mark(device_embed ? "upload meta + embed" : "upload meta + hidden");
    if (step_begin) check(cudaEventRecord(step_begin, stream), "step event");
    const size_t meta_used = size_t(kMetaRowArrays * max_chunk + int64_t(batch.size()) * sets * stride) * 4;
    check(cudaMemcpyAsync(meta_dev.as(), meta_host.as(), meta_used, cudaMemcpyHostToDevice, stream), "meta up");
    if (!device_embed)
      check(cudaMemcpyAsync(hidden.as(), hidden_host.as(), size_t(n * H) * 4, cudaMemcpyHostToDevice, stream),
            "hidden up");
    if (ple_width > 0)
      check(cudaMemcpyAsync(ple.as(), ple_host.as(), size_t(n * ple_width) * 4, cudaMemcpyHostToDevice, stream),
            "per-layer inputs up");
    if (any_deltanet && gpu_layers > 0)
      check(cudaMemcpyAsync(delta_segments_dev.as(), delta_segments_host.as(),
                            size_t(device::deltanet_segment_ints(int64_t(batch.size()))) * 4, cudaMemcpyHostToDevice,
                            stream),
            "segments up");
    const int32_t* pos_dev = meta_dev.as<int32_t>();
    const int32_t* row_cache_dev = pos_dev + max_chunk;
    const int32_t* heads_dev = pos_dev + 2 * max_chunk;
    const int32_t* tokens_dev = pos_dev + 3 * max_chunk;
    tiles_dev = pos_dev + 4 * max_chunk;
    // Full-attention layers read each sequence's first table, sliding-window layers its ring table (the last).
    const int32_t* tables_at = pos_dev + kMetaRowArrays * max_chunk;
    const device::PageTables full_tables{tables_at, sets * stride, row_cache_dev},
        ring_tables{tables_at + (sets - 1) * stride, sets * stride, row_cache_dev};

    // Head rows [r0, r0 + count): final norm, output matrix, then the greedy argmax when asked for.
    auto head_pass = [&](int64_t r0, int64_t count) {
      mark("head: gather + final norm");
      device::gather_rows(hidden.as<float>(), heads_dev + r0, count, H, normed.as<float>(), stream);
      device::rms_norm(normed.as<float>(), H, final_norm.as<float>(), count, H, H, float(c.rms_norm_eps),
                       normed.as<float>(), H, stream);
      mark("head: output matrix");
      multiply(output.ref, normed.as<float>(), count, logits.as<float>(), c.vocab_size, false, head_pass_rows);
      if (c.final_logit_softcapping > 0) {
        mark("head: soft-capping");
        device::soft_cap(logits.as<float>(), count * c.vocab_size, float(c.final_logit_softcapping), stream);
      }
      if (argmax) {
        mark("head: argmax");
        device::argmax_rows(logits.as<float>(), count, c.vocab_size, argmax_scratch.as(), head_pass_rows,
                            ids_dev.as<int32_t>(), stream);
      }
    };
    const int64_t first_pass = std::min(head_count, head_pass_rows);
    auto kernels = [&] {
      if (device_embed) device::embed_rows(output.ref, tokens_dev, n, hidden.as<float>(), stream);
      for (int64_t l = 0; l < gpu_layers; ++l)
        layer(l, n, pos_dev, layers[size_t(l)].window > 0 ? ring_tables : full_tables, one_row_per_sequence);
      if (first_pass > 0) head_pass(0, first_pass);
    };
    // A dense decode step is the same launches every time (positions, KV tables, tokens and head rows are read
    // from device memory), so it is captured once per shape into a CUDA graph and replayed: one launch instead of
    // ~10 per layer; so is a MoE decode step whose layers all route on the device. MoE layers that route on the
    // host mid-step, and the cuBLAS path (> kMaxMatvecRows rows), which may allocate workspace, run eagerly, as do
    // profiled runs (events per operation).
    const bool host_free = !c.arch.moe || (gpu_layers > 0 && std::all_of(routes_on_device.begin(),
                                                                         routes_on_device.end(),
                                                                         [](bool b) { return b; }));
    if (host_free && n <= device::kMaxMatvecRows && !options.profile && use_graph) {
      const GraphKey key{n, first_pass, one_row_per_sequence, argmax, device_embed};
      cudaGraphExec_t exec = nullptr;
      for (const auto& [k, e] : graphs)
        if (k == key) exec = e;
      if (exec && c.arch.moe) {  // a replay: what kernels() counts when it records the routed layers
        const int64_t sparse = std::count_if(layers.begin(), layers.end(), [](const DeviceLayer& d) { return d.sparse; });
        stats.resident_hits += uint64_t(sparse * n * c.num_experts_per_tok);
        stats.device_routed += uint64_t(sparse);
      }
      if (!exec) {
        check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
        kernels();
        cudaGraph_t graph = nullptr;
        check(cudaStreamEndCapture(stream, &graph), "end capture");
        const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        check(made, "graph instantiate");
        graphs.push_back({key, exec});
      }
      check(cudaGraphLaunch(exec, stream), "graph launch");
    } else {
      kernels();
    }

    if (head) {
      // Each pass's results come down through the staging; passes after the first run once it is copied out.
      for (int64_t r0 = 0; r0 < head_count; r0 += head_pass_rows) {
        const int64_t count = std::min(head_pass_rows, head_count - r0);
        if (r0 > 0) head_pass(r0, count);
        mark("head: results down");
        if (argmax)
          check(cudaMemcpyAsync(ids_host.as(), ids_dev.as(), size_t(count) * 4, cudaMemcpyDeviceToHost, stream),
                "ids down");
        if (!step.head_out.empty())
          check(cudaMemcpyAsync(logits_host.as(), logits.as(), size_t(count * c.vocab_size) * 4,
                                cudaMemcpyDeviceToHost, stream),
                "logits down");
        if (r0 + count < head_count) {
          check(cudaStreamSynchronize(stream), "head pass");
        } else {
          mark("end");
          end_step();
        }
        check(cudaGetLastError(), "kernels");
        for (int64_t i = 0; i < count; ++i) {
          if (argmax) step.head_argmax[size_t(r0 + i)] = ids_host.as<int32_t>()[i];
          if (!step.head_out.empty())
            std::memcpy(step.head_out[size_t(r0 + i)], logits_host.as<float>() + i * c.vocab_size,
                        size_t(c.vocab_size) * 4);
        }
      }
      if (head_count == 0) {
        mark("end");
        end_step();
      }
      collect_profile();
      return;
    }
    mark("hidden down");
    check(cudaMemcpyAsync(hidden_host.as(), hidden.as(), size_t(n * H) * 4, cudaMemcpyDeviceToHost, stream),
          "hidden down");
    mark("end");
    end_step();
    check(cudaGetLastError(), "kernels");
    collect_profile();
    std::memcpy(step.hidden, hidden_host.as(), size_t(n * H) * 4);
  }

  // The step's segments for the Gated DeltaNet kernels (deltanet_kernels.cuh), in delta_segments_host: each sequence's
  // rows must be one run of consecutive positions (the recurrence folds them in order).
  void stage_deltanet_segments(int64_t n, const int32_t* pos, const int32_t* cache_of_row,
                               const std::vector<const void*>& batch) {
    int32_t* seg = delta_segments_host.as<int32_t>();
    int32_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (i > 0 && cache_of_row[i] == cache_of_row[i - 1]) {
        if (pos[i] != pos[i - 1] + 1)
          throw std::invalid_argument("gpu: a sequence's rows in a step with Gated DeltaNet layers must be "
                                      "consecutive positions");
        ++seg[1 + 4 * (count - 1) + 1];
        continue;
      }
      if (count == int32_t(batch.size()))
        throw std::invalid_argument("gpu: a sequence's rows in a step with Gated DeltaNet layers must be consecutive "
                                    "rows");
      int32_t* s = seg + 1 + 4 * count++;
      s[0] = int32_t(i);
      s[1] = 1;
      s[2] = sequences.at(batch[size_t(cache_of_row[i])]).state_slot;
      s[3] = pos[i] == 0 ? 1 : 0;
    }
    seg[0] = count;
  }

  // Waits for the step; with options.time_steps adds its device time.
  void end_step() {
    if (step_end) check(cudaEventRecord(step_end, stream), "step event");
    check(cudaStreamSynchronize(stream), "step");
    if (step_end) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, step_begin, step_end), "step time");
      step_ms_total += ms;
      ++timed_steps;
    }
  }

  // Layer l's attention shape (the model's, or a Gemma 4 layer's own head_dim and KV heads).
  device::QkvParams attention_shape(int64_t l) const {
    device::QkvParams p{};
    const bool own = l < int64_t(layers.size()) && layers[size_t(l)].head_dim > 0;
    p.heads = c.num_heads;
    p.kv_heads = own ? layers[size_t(l)].kv_heads : c.num_kv_heads;
    p.head_dim = own ? layers[size_t(l)].head_dim : c.head_dim;
    return p;
  }

  void layer(int64_t l, int64_t n, const int32_t* pos_dev, const device::PageTables& tables,
             bool one_row_per_sequence) {
    const DeviceLayer& d = layers[size_t(l)];
    const model::LayerWeights& L = w.layers[size_t(l)];
    const int64_t H = c.hidden_size, hd = c.head_dim, q_rows = c.num_heads * hd;
    const float eps = float(c.rms_norm_eps);
    float* h = hidden.as<float>();
    float* x = normed.as<float>();
    if (d.mla) {
      mla_attention(l, n, pos_dev, tables);
      feed_forward(l, n);
      return;
    }
    if (d.deltanet) {
      gated_deltanet(l, n);
      feed_forward(l, n);
      return;
    }
    if (d.gemma4) {
      gemma4_layer(l, n, pos_dev, tables);
      return;
    }
    // Gated attention: the projection's rows are [query | gate] per head, then k and v; split below.
    const bool gated = c.arch.attention_output_gate;
    float* projected = gated ? gated_qkv.as<float>() : qkv.as<float>();
    // Decode (one row): the norms and the SiLU gate are fused into the next matvec's load of x.
    if (n == 1 && fused_matvec && device::decode_fusable(d.qkv.ref)) {
      mark("input norm + qkv matrix");
      device::matvec_normed(d.qkv.ref, h, d.input_norm.as<float>(), eps, projected, false, stream);
    } else {
      mark("input norm");
      device::rms_norm(h, H, d.input_norm.as<float>(), n, H, H, eps, x, H, stream);
      mark("qkv matrix");
      multiply(d.qkv.ref, x, n, projected, d.qkv.ref.rows, false);
    }
    if (gated) {
      mark("split query / gate");
      device::split_query_gate(projected, n, c.num_heads, c.num_kv_heads, hd, qkv.as<float>(), gates.as<float>(),
                               stream);
    }
    device::QkvParams p = attention_shape(l);
    p.bias = L.qkv_bias.empty() ? nullptr : d.qkv_bias.as<float>();
    p.q_norm = L.q_norm.empty() ? nullptr : d.q_norm.as<float>();
    p.k_norm = L.k_norm.empty() ? nullptr : d.k_norm.as<float>();
    p.qn = int64_t(L.q_norm.size());
    p.kn = int64_t(L.k_norm.size());
    p.eps = eps;
    p.inv_freq = inv_freq.as<float>();
    p.rope_scale = rope_scale;
    p.window = d.window;
    p.sinks = L.sinks.empty() ? nullptr : d.sinks.as<float>();
    p.rotary_dim = rotary_dim;
    const bool fused = one_row_per_sequence && fused_attention && device::attention_can_fuse(p);
    if (!fused) {
      mark("bias/qk norm/rope/kv store");
      device::qkv_rope_store(qkv.as<float>(), n, p, pos_dev, kv_refs[size_t(l)], tables, stream);
    }
    if (step_tiles > 0 && !fused) {
      mark("prefill attention");
      device::prefill_attention(qkv.as<float>(), step_tiles, tiles_dev, p, pos_dev, kv_refs[size_t(l)], tables,
                                attn.as<float>(), stream);
    } else {
      mark(fused ? "attention (+ bias/qk norm/rope/kv store)" : "attention");
      device::attention(qkv.as<float>(), n, p, pos_dev, kv_refs[size_t(l)], tables, max_context, fused,
                        scores.as<float>(), arrivals.as<int32_t>(), attn.as<float>(), stream);
    }
    if (gated) {
      mark("output gate");
      device::sigmoid_gate(attn.as<float>(), gates.as<float>(), n * q_rows, stream);
    }
    mark("o matrix");
    multiply(d.o.ref, attn.as<float>(), n, h, H, true);
    if (!L.o_bias.empty()) device::add_bias_rows(h, n, H, H, d.o_bias.as<float>(), stream);
    feed_forward(l, n);
  }

  // A Gemma 4 layer (engine::Forward's gemma4 steps, in its order): input norm, the attention projection, q/k norms,
  // v_norm, the layer type's RoPE and the query scale (gemma4_qkv), the K/V stored (own KV) or the source layer's
  // read (KV-shared), attention over the layer's window, o_proj and its sandwich norm into the residual; then the
  // feed-forward block (gemma4_feed_forward), the per-layer input and layer_scalar.
  void gemma4_layer(int64_t l, int64_t n, const int32_t* pos_dev, const device::PageTables& tables) {
    const DeviceLayer& d = layers[size_t(l)];
    const int64_t H = c.hidden_size;
    const float eps = float(c.rms_norm_eps);
    float* h = hidden.as<float>();
    float* x = normed.as<float>();
    mark("input norm");
    device::rms_norm(h, H, d.input_norm.as<float>(), n, H, H, eps, x, H, stream);
    mark("qkv matrix");
    multiply(d.qkv.ref, x, n, g4_proj.as<float>(), d.qkv.ref.rows, false);
    mark("gemma4: q/k/v norms, rope, query scale");
    device::Gemma4QkvParams g;
    g.heads = c.num_heads, g.kv_heads = d.kv_heads, g.head_dim = d.head_dim;
    g.own_kv = d.kv_source < 0, g.k_eq_v = d.k_eq_v;
    g.q_norm = d.q_norm.as<float>(), g.k_norm = g.own_kv ? d.k_norm.as<float>() : nullptr, g.eps = eps;
    g.inv_freq = d.rope_inv_freq.as<float>(), g.rotary_dim = d.rotary_dim, g.q_scale = d.q_scale;
    device::gemma4_qkv(g4_proj.as<float>(), d.qkv.ref.rows, n, g, pos_dev, qkv.as<float>(), stream);
    device::QkvParams p = attention_shape(l);
    p.eps = eps;
    p.window = d.window;
    const device::KvRef& kv = kv_refs[size_t(l)];  // a KV-shared layer's: its source's
    if (g.own_kv) {
      mark("kv store");
      device::qkv_rope_store(qkv.as<float>(), n, p, pos_dev, kv, tables, stream);  // no bias, norms or rope: stores
    }
    if (step_tiles > 0) {
      mark("prefill attention");
      device::prefill_attention(qkv.as<float>(), step_tiles, tiles_dev, p, pos_dev, kv, tables, attn.as<float>(),
                                stream);
    } else {
      mark("attention");
      device::attention(qkv.as<float>(), n, p, pos_dev, kv, tables, max_context, false, scores.as<float>(),
                        arrivals.as<int32_t>(), attn.as<float>(), stream);
    }
    mark("o matrix + post-attention norm");
    multiply(d.o.ref, attn.as<float>(), n, out.as<float>(), H, false);
    device::rms_norm_add(out.as<float>(), H, d.post_norm.as<float>(), n, H, eps, h, H, stream);
    gemma4_feed_forward(l, n);
    if (c.per_layer_input_size > 0) {
      // hidden += norm(projection(gelu(gate(hidden)) * the row's per-layer input of this layer))
      const int64_t P = c.per_layer_input_size;
      mark("gemma4: per-layer input");
      multiply(d.ple_gate.ref, h, n, ple_gate.as<float>(), P, false);
      device::gelu_times(ple_gate.as<float>(), n, P, ple.as<float>() + l * P, c.num_layers * P, stream);
      multiply(d.ple_projection.ref, ple_gate.as<float>(), n, g4_mlp.as<float>(), H, false);
      device::rms_norm_add(g4_mlp.as<float>(), H, d.post_ple_norm.as<float>(), n, H, eps, h, H, stream);
    }
    if (d.layer_scalar != 1.0f) {
      mark("gemma4: layer_scalar");
      device::scale(h, n * H, d.layer_scalar, stream);
    }
  }

  // Gemma 4's feed-forward block (engine::Forward::feed_forward_gemma4): hidden += post_ffn_norm(MLP(pre_ffn_norm(h)))
  // for a dense layer; with the MoE block, hidden += post_ffn_norm(post_ffn_norm_1(MLP(pre_ffn_norm(h))) +
  // post_ffn_norm_2(experts(pre_ffn_norm_2(h)))), routed on the host from rms_norm(h) * router_scale / sqrt(H).
  void gemma4_feed_forward(int64_t l, int64_t n) {
    const DeviceLayer& d = layers[size_t(l)];
    const int64_t H = c.hidden_size, I = d.intermediate;
    const float eps = float(c.rms_norm_eps);
    float* h = hidden.as<float>();
    float* x = normed.as<float>();
    float* mlp = g4_mlp.as<float>();
    mark("pre-feedforward norm + gate_up matrix");
    device::rms_norm(h, H, d.pre_ffn_norm.as<float>(), n, H, H, eps, x, H, stream);
    multiply(d.gate_up.ref, x, n, ffn.as<float>(), 2 * I, false);
    mark("gelu gate + down matrix");
    device::gelu_gate(ffn.as<float>(), n, I, act.as<float>(), stream);
    multiply(d.down.ref, act.as<float>(), n, mlp, H, false);
    if (!d.sparse) {
      mark("post-feedforward norm");
      device::rms_norm_add(mlp, H, d.post_ffn_norm.as<float>(), n, H, eps, h, H, stream);
      return;
    }
    float* sum = g4_sum.as<float>();
    float* moe_out = g4_moe.as<float>();
    mark("moe: norms + router input");
    device::rms_norm(mlp, H, d.post_ffn_norm_1.as<float>(), n, H, H, eps, sum, H, stream);
    device::router_input(h, n, H, d.router_scale.as<float>(), float(1.0 / std::sqrt(double(H))), eps,
                         g4_router.as<float>(), stream);
    device::rms_norm(h, H, d.pre_ffn_norm_2.as<float>(), n, H, H, eps, x, H, stream);
    check(cudaMemsetAsync(moe_out, 0, size_t(n * H) * 4, stream), "moe output");
    host_routed(l, n, x, g4_router.as<float>(), moe_out);
    mark("moe: post-feedforward norms");
    device::rms_norm_add(moe_out, H, d.post_ffn_norm_2.as<float>(), n, H, eps, sum, H, stream);
    device::rms_norm_add(sum, H, d.post_ffn_norm.as<float>(), n, H, eps, h, H, stream);
  }

  // A Gated DeltaNet layer (engine::GatedDeltaNet's arithmetic): hidden += out_proj(mixer(input_norm(hidden))), the
  // step's segments (stage_deltanet_segments) each carrying its sequence's conv and recurrent state.
  void gated_deltanet(int64_t l, int64_t n) {
    const DeviceLayer& d = layers[size_t(l)];
    const int64_t H = c.hidden_size;
    float* h = hidden.as<float>();
    float* x = normed.as<float>();
    device::DeltaNetParams p = delta_shape;
    p.conv = d.conv.as<float>(), p.decay_rate = d.decay_rate.as<float>(), p.dt_bias = d.dt_bias.as<float>();
    p.norm = d.gated_norm.as<float>(), p.state = d.state.as<float>();
    const int32_t* segments = delta_segments_dev.as<int32_t>();
    const int64_t max_segments = std::min<int64_t>(n, options.max_sequences);
    mark("input norm");
    device::rms_norm(h, H, d.input_norm.as<float>(), n, H, H, float(c.rms_norm_eps), x, H, stream);
    mark("deltanet: [qkv | z | b | a] matrix");
    multiply(d.linear_in.ref, x, n, delta_proj.as<float>(), p.projected_width(), false);
    mark("deltanet: conv1d");
    device::deltanet_conv(delta_proj.as<float>(), max_segments, segments, p, delta_mixed.as<float>(), stream);
    mark("deltanet: recurrence + gated norm");
    device::deltanet_recurrence(delta_proj.as<float>(), delta_mixed.as<float>(), max_segments, segments, p,
                                delta_core.as<float>(), stream);
    mark("o matrix");
    multiply(d.o.ref, delta_core.as<float>(), n, h, H, true);
    if (!w.layers[size_t(l)].o_bias.empty()) device::add_bias_rows(h, n, H, H, d.o_bias.as<float>(), stream);
  }

  // DeepSeek's multi-head latent attention (the absorbed form, as the CPU's engine::MlaAttention, for prefill and
  // decode alike: the latent cache is the only state, so chunked prefill, whole prefill and decode agree, and no
  // per-head keys or values are ever expanded): hidden += o_proj(MLA(input_norm(hidden))).
  void mla_attention(int64_t l, int64_t n, const int32_t* pos_dev, const device::PageTables& tables) {
    const DeviceLayer& d = layers[size_t(l)];
    const model::MlaConfig& m = c.mla;
    const int64_t H = c.hidden_size, heads = c.num_heads;
    const int64_t first = m.q_lora_rank > 0 ? m.q_lora_rank : heads * m.qk_head_dim(), stride = d.mla_in.ref.rows;
    float* h = hidden.as<float>();
    float* x = normed.as<float>();
    device::MlaParams p = mla_shape;
    p.kv_norm = d.kv_a_norm.as<float>();
    p.key = d.kv_b_key.as<float>();
    p.value = d.kv_b_value.as<float>();
    mark("input norm");
    device::rms_norm(h, H, d.input_norm.as<float>(), n, H, H, float(c.rms_norm_eps), x, H, stream);
    mark("mla: [q_a | kv_a] matrix");
    multiply(d.mla_in.ref, x, n, mla_proj.as<float>(), stride, false);
    mark("mla: latent norm/rope/store");
    device::mla_store_latent(mla_proj.as<float>() + first, stride, n, p, pos_dev, latent_refs[size_t(l)], tables,
                             stream);
    const float* q = mla_proj.as<float>();
    int64_t ldq = stride;
    if (m.q_lora_rank > 0) {
      mark("mla: q_a norm + q_b matrix");
      device::rms_norm(mla_proj.as<float>(), stride, d.q_a_norm.as<float>(), n, m.q_lora_rank, m.q_lora_rank,
                       p.norm_eps, mla_qa.as<float>(), m.q_lora_rank, stream);
      multiply(d.q_b.ref, mla_qa.as<float>(), n, mla_q.as<float>(), heads * m.qk_head_dim(), false);
      q = mla_q.as<float>();
      ldq = heads * m.qk_head_dim();
    }
    mark("mla: absorbed query + rope");
    device::mla_query(q, ldq, n, p, pos_dev, mla_q_latent.as<float>(), mla_q_rope.as<float>(), stream);
    mark("mla: attention");
    if (n <= mla_split_rows)  // few rows (decode): split over positions so that the blocks fill the GPU
      device::mla_attention_split(mla_q_latent.as<float>(), mla_q_rope.as<float>(), n, p, pos_dev,
                                  latent_refs[size_t(l)], tables, max_context, mla_split.as<float>(),
                                  mla_out.as<float>(), stream);
    else
      device::mla_attention(mla_q_latent.as<float>(), mla_q_rope.as<float>(), n, p, pos_dev, latent_refs[size_t(l)],
                            tables, mla_out.as<float>(), stream);
    mark("o matrix");
    multiply(d.o.ref, mla_out.as<float>(), n, h, H, true);
  }

  // The layer's MLP (dense, or the MoE block) on the post-attention norm of hidden, added to hidden.
  void feed_forward(int64_t l, int64_t n) {
    const DeviceLayer& d = layers[size_t(l)];
    const model::LayerWeights& L = w.layers[size_t(l)];
    const int64_t H = c.hidden_size;
    const float eps = float(c.rms_norm_eps);
    float* h = hidden.as<float>();
    float* x = normed.as<float>();
    const int64_t I = d.intermediate;
    const bool mlp_biases = !L.gate_up_bias.empty() || !L.down_bias.empty();
    if (!d.sparse && n == 1 && !mlp_biases && fused_matvec && device::decode_fusable(d.gate_up.ref) &&
        device::decode_fusable(d.down.ref)) {
      mark("post-attention norm + gate_up matrix");
      device::matvec_normed(d.gate_up.ref, h, d.post_norm.as<float>(), eps, ffn.as<float>(), false, stream);
      mark("silu gate + down matrix");
      device::matvec_gated(d.down.ref, ffn.as<float>(), h, true, stream);
      return;
    }
    mark("post-attention norm");
    device::rms_norm(h, H, d.post_norm.as<float>(), n, H, H, eps, x, H, stream);
    if (d.sparse) {
      moe(l, n);
      return;
    }
    mark("gate_up matrix");
    multiply(d.gate_up.ref, x, n, ffn.as<float>(), 2 * I, false);
    if (!L.gate_up_bias.empty()) device::add_bias_rows(ffn.as<float>(), n, 2 * I, 2 * I, d.gate_up_bias.as<float>(), stream);
    mark("silu gate");
    device::silu_gate(ffn.as<float>(), n, I, act.as<float>(), stream);
    mark("down matrix");
    multiply(d.down.ref, act.as<float>(), n, h, H, true);
    // (hidden + down x) + bias: the CPU's add_residual order, as o_proj's bias above
    if (!L.down_bias.empty()) device::add_bias_rows(h, n, H, H, d.down_bias.as<float>(), stream);
  }

  // ---- MoE ------------------------------------------------------------------------------------------------
  // Least recently used slot. A slot used earlier in this same step may be taken again: its compute is already
  // enqueued, and the copy stream waits for that (slot_free) before overwriting it.
  int64_t victim_slot() {
    int64_t best = 0;
    for (int64_t s = 1; s < int64_t(slots.size()); ++s)
      if (slot_use[size_t(s)] < slot_use[size_t(best)]) best = s;
    return best;
  }

  void moe(int64_t l, int64_t n) {
    const int64_t k = c.num_experts_per_tok;
    const float* x = normed.as<float>();
    float* h = hidden.as<float>();
    if (n <= device::kMaxMatvecRows && routes_on_device[size_t(l)]) {
      // Decode (up to kMaxMatvecRows rows) with every expert of the layer in VRAM: routing, the routed experts and
      // their weighted sum on the device (5 kernels, no host round trip, so the step can be one CUDA graph).
      mark("moe: router + device routing + experts");
      device_routed(l, n);
      stats.resident_hits += uint64_t(n * k);
    } else if (n <= device::kMaxMatvecRows && hybrid_on_device[size_t(l)] && host_moe && n <= options.cpu_expert_rows) {
      hybrid_decode(l, n);
    } else {
      // The shared expert is enqueued while the host routes (and runs experts on the CPU), so the GPU works then.
      host_routed(l, n, x, x, h, [&] { shared_expert(l, n); });
    }
  }

  // Decode routing on the device: the router and top-k, then the routed experts of the layer's VRAM table (a null
  // entry adds nothing) and the shared expert, all on the stream. between() enqueues what must come after the
  // routing and before the experts (the hybrid path's downloads).
  void device_routed(int64_t l, int64_t n, const std::function<void()>& between = {}) {
    const DeviceLayer& d = layers[size_t(l)];
    const int64_t E = c.num_experts, k = c.num_experts_per_tok;
    const float* x = normed.as<float>();
    multiply(d.router.ref, x, n, router_dev.as<float>(), E, false);
    device::route_topk(router_dev.as<float>(), n, E, k, c.arch.moe_renormalize || c.norm_topk_prob,
                       route_ids.as<int32_t>(), route_weights.as<float>(), stream);
    if (between) between();
    device::routed_experts(routed_gate_up, routed_down, expert_table.as<const void* const>() + l * E,
                           route_ids.as<int32_t>(), route_weights.as<float>(), n, k, x,
                           routed_gate_up_out.as<float>(), routed_down_out.as<float>(), hidden.as<float>(), stream);
    shared_expert(l, n);
    ++stats.device_routed;
  }

  // Hybrid placement, decode: routing on the device, the routed experts in VRAM there (a null table entry adds
  // nothing), the shared expert after them; meanwhile the ids, weights and rows come down, and the CPU runs the
  // choices whose experts are not in VRAM (from the host expert cache); their sum goes up and is added last.
  void hybrid_decode(int64_t l, int64_t n) {
    const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
    float* h = hidden.as<float>();
    const float* x = normed.as<float>();
    mark("moe: router + device routing + VRAM experts (hybrid)");
    int32_t* ids = hybrid_host.as<int32_t>();
    float* weights = reinterpret_cast<float*>(ids + device::kMaxMatvecRows * k);
    device_routed(l, n, [&] {
      check(cudaMemcpyAsync(ids, route_ids.as(), size_t(n * k) * 4, cudaMemcpyDeviceToHost, stream), "ids down");
      check(cudaMemcpyAsync(weights, route_weights.as(), size_t(n * k) * 4, cudaMemcpyDeviceToHost, stream),
            "weights down");
      check(cudaMemcpyAsync(cpu_x_host.as(), x, size_t(n * H) * 4, cudaMemcpyDeviceToHost, stream), "rows down");
      check(cudaEventRecord(router_ready, stream), "router record");
    });
    check(cudaEventSynchronize(router_ready), "router");
    cpu_ids.assign(ids, ids + n * k);
    cpu_weights.assign(weights, weights + n * k);
    std::vector<int32_t>& on_cpu = cpu_experts_now;
    on_cpu.clear();
    for (int32_t& e : cpu_ids) {
      if (e < 0 || e >= E) throw std::runtime_error(fmt::format("gpu: device routing chose expert {} of {}", e, E));
      if (resident.count(l * E + e)) {
        e = engine::MoeBlock::kNotHere;
        ++stats.resident_hits;
      } else if (std::find(on_cpu.begin(), on_cpu.end(), e) == on_cpu.end()) {
        on_cpu.push_back(e);
      }
    }
    if (!on_cpu.empty()) cpu_experts(l, n, h, on_cpu.size());
  }

  // The choices in cpu_ids / cpu_weights (the others kNotHere) on the CPU, from the rows in cpu_x_host, while the GPU
  // runs what was enqueued before; their sum goes up behind it and is added to h. (The pinned buffers are free: the
  // previous layer's upload came before this layer's router_ready.) `experts`: how many distinct ones, for stats.
  void cpu_experts(int64_t l, int64_t n, float* h, size_t experts) {
    const int64_t H = c.hidden_size;
    mark("moe: experts on the CPU (host time)");
    float* sum = cpu_sum_host.as<float>();
    std::fill(sum, sum + n * H, 0.0f);
    host_moe->accumulate_routed(l, cpu_x_host.as<float>(), n, cpu_ids, cpu_weights, sum);
    check(cudaMemcpyAsync(cpu_sum_dev.as(), sum, size_t(n * H) * 4, cudaMemcpyHostToDevice, stream), "cpu experts up");
    device::add(h, cpu_sum_dev.as<float>(), n * H, stream);
    stats.cpu_experts += experts;
  }

  // qwen2_moe's gated shared expert, or DeepSeek's ungated shared experts (none: nothing), added to hidden.
  void shared_expert(int64_t l, int64_t n) {
    const DeviceLayer& d = layers[size_t(l)];
    if (!d.shared_down.present()) return;
    const int64_t H = c.hidden_size;
    float* h = hidden.as<float>();
    const float* x = normed.as<float>();
    mark("moe: shared expert");
    const int64_t S = c.shared_expert_intermediate_size;
    multiply(d.shared_gate_up.ref, x, n, ffn.as<float>(), 2 * S, false);
    device::silu_gate(ffn.as<float>(), n, S, act.as<float>(), stream);
    if (w.layers[size_t(l)].shared_expert_gate.empty()) {
      multiply(d.shared_down.ref, act.as<float>(), n, h, H, true);
    } else {
      multiply(d.shared_down.ref, act.as<float>(), n, out.as<float>(), H, false);
      device::sigmoid_gate_add(x, d.shared_expert_gate.as<float>(), out.as<float>(), n, H, h, stream);
    }
  }

  // The routed experts with routing on the host: the router's output comes down (one small download and a wait per
  // MoE layer), and experts missing in VRAM are copied from the host expert cache through pinned staging, or, in
  // steps of at most options.cpu_expert_rows rows with a host MoeBlock, run on the CPU from that cache (their sum
  // goes up and is added to h after the VRAM experts). The experts read x and add into h; the router reads route_x
  // (Gemma 4's router input; x elsewhere). before_wait enqueues GPU work that overlaps the host's part.
  void host_routed(int64_t l, int64_t n, const float* x, const float* route_x, float* h,
                   const std::function<void()>& before_wait = {}) {
    const DeviceLayer& d = layers[size_t(l)];
    const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
    const bool cpu_step = host_moe && n <= options.cpu_expert_rows;
    mark("moe: router + host routing");
    multiply(d.router.ref, route_x, n, router_dev.as<float>(), E, false);
    check(cudaMemcpyAsync(router_host.as(), router_dev.as(), size_t(n * E) * 4, cudaMemcpyDeviceToHost, stream),
          "router down");
    if (cpu_step)
      check(cudaMemcpyAsync(cpu_x_host.as(), x, size_t(n * H) * 4, cudaMemcpyDeviceToHost, stream), "rows down");
    check(cudaEventRecord(router_ready, stream), "router record");
    if (before_wait) before_wait();
    check(cudaEventSynchronize(router_ready), "router");
    if (const std::vector<float>& bias = w.layers[size_t(l)].router_bias; !bias.empty())  // gpt-oss, as the CPU's
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < E; ++e) router_host.as<float>()[i * E + e] += bias[size_t(e)];
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> weights(static_cast<size_t>(n * k));
    const std::vector<float>& correction = w.layers[size_t(l)].score_correction_bias;  // DeepSeek-V3
    for (int64_t i = 0; i < n; ++i)
      engine::route_top_k(c, router_host.as<float>() + i * E, correction.empty() ? nullptr : correction.data(),
                          ids.data() + i * k, weights.data() + i * k, route_scratch);
    if (const std::vector<float>& scale = w.layers[size_t(l)].per_expert_scale; !scale.empty())  // Gemma 4
      for (int64_t j = 0; j < n * k; ++j) weights[size_t(j)] *= scale[size_t(ids[size_t(j)])];
    std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(E));
    std::vector<std::vector<float>> weight_of(static_cast<size_t>(E));
    std::vector<int32_t> used;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[size_t(i * k + j)];
        if (rows_of[size_t(e)].empty()) used.push_back(e);
        rows_of[size_t(e)].push_back(int32_t(i));
        weight_of[size_t(e)].push_back(weights[size_t(i * k + j)]);
      }
    // Experts already in VRAM first, so their compute overlaps the copies of the others.
    const auto in_vram = std::stable_partition(used.begin(), used.end(), [&](int32_t e) {
      const int64_t key = l * E + e;
      return resident.count(key) || slot_of.count(key);
    });
    // A CPU step: the others run on the CPU, their choices marked in cpu_ids (the rest engine::MoeBlock::kNotHere).
    size_t cpu_count = 0;
    if (cpu_step) {
      cpu_count = size_t(used.end() - in_vram);
      std::vector<bool> on_cpu(size_t(E), false);
      for (auto it = in_vram; it != used.end(); ++it) on_cpu[size_t(*it)] = true;
      used.erase(in_vram, used.end());
      cpu_ids.assign(ids.begin(), ids.end());
      cpu_weights.assign(weights.begin(), weights.end());
      for (size_t j = 0; j < cpu_ids.size(); ++j)
        if (!on_cpu[size_t(cpu_ids[j])]) cpu_ids[j] = engine::MoeBlock::kNotHere;
    }
    // Route table (row index, weight) per expert, uploaded once.
    int32_t* route_rows = moe_host.as<int32_t>();
    float* route_weights = reinterpret_cast<float*>(route_rows + max_chunk * k);
    std::vector<int64_t> offset(static_cast<size_t>(E));
    int64_t at = 0;
    for (int32_t e : used) {
      offset[size_t(e)] = at;
      for (size_t r = 0; r < rows_of[size_t(e)].size(); ++r, ++at) {
        route_rows[at] = rows_of[size_t(e)][r];
        route_weights[at] = weight_of[size_t(e)][r];
      }
    }
    check(cudaMemcpyAsync(moe_dev.as(), moe_host.as(), size_t(max_chunk * k) * 8, cudaMemcpyHostToDevice, stream),
          "route up");
    const int32_t* rows_dev = moe_dev.as<int32_t>();
    const float* weights_dev = reinterpret_cast<const float*>(rows_dev + max_chunk * k);

    mark("moe: experts");
    size_t staging = 0;
    tiering::ExpertCache& host_cache = w.experts->cache();
    // Every expert this layer misses in VRAM is requested from the host cache at once, so the ones it must read
    // from NVMe are read together (one batch of io_uring reads) while the first copies and computes go on.
    // (As many as the host cache has unpinned slots for; the rest are requested one by one below.)
    std::vector<int32_t> requested;
    for (int32_t e : used)
      if (!resident.count(l * E + e) && !slot_of.count(l * E + e)) requested.push_back(e);
    requested.resize(size_t(std::min<int64_t>(int64_t(requested.size()), host_cache.available_slots())));
    const int64_t el = d.expert_layer;  // the tier's index of this layer
    if (!requested.empty()) host_cache.request(el, requested);
    for (int32_t e : used) {
      const int64_t key = l * E + e;
      const void* block = nullptr;
      int64_t slot = -1;
      if (auto r = resident.find(key); r != resident.end()) {
        block = r->second;
        ++stats.resident_hits;
      } else if (auto s = slot_of.find(key); s != slot_of.end()) {
        slot = s->second;
        ++stats.slot_hits;
      } else {
        // Miss: the host expert cache supplies the block (RAM, or NVMe into its slots); it goes through pinned
        // staging to a VRAM slot on the copy stream, which waits until the slot's previous user has finished.
        slot = victim_slot();
        if (slot_key[size_t(slot)] >= 0) slot_of.erase(slot_key[size_t(slot)]);
        slot_key[size_t(slot)] = -1;  // (so a slot whose fill fails below maps nothing)
        const auto pinned = std::find(requested.begin(), requested.end(), e);
        if (pinned == requested.end()) host_cache.request(el, std::span(&e, 1));
        tiering::ExpertViews v;
        try {
          v = host_cache.acquire(el, e);
        } catch (...) {
          // An expert that could not be loaded (ReaderError) fails this step. The requested experts after it are
          // still pinned in the host cache: released, so the next step has every slot (e's own slot was dropped).
          for (auto r = pinned == requested.end() ? requested.end() : pinned + 1; r != requested.end(); ++r)
            host_cache.release(el, *r);
          throw;
        }
        check(cudaEventSynchronize(staging_done[staging]), "staging reuse");
        std::memcpy(expert_staging[staging].as(), host_block(v), expert_layout.bytes);
        host_cache.release(el, e);
        check(cudaStreamWaitEvent(copy_stream, slot_free[size_t(slot)]), "slot wait");
        check(cudaMemcpyAsync(slots[size_t(slot)], expert_staging[staging].as(), expert_layout.bytes,
                              cudaMemcpyHostToDevice, copy_stream),
              "expert copy");
        check(cudaEventRecord(staging_done[staging], copy_stream), "staging record");
        check(cudaEventRecord(slot_ready[size_t(slot)], copy_stream), "slot record");
        check(cudaStreamWaitEvent(stream, slot_ready[size_t(slot)]), "slot ready");
        staging = (staging + 1) % expert_staging.size();
        slot_key[size_t(slot)] = key;
        slot_of[key] = slot;
        ++stats.misses;
        stats.bytes_copied += expert_layout.bytes;
      }
      if (slot >= 0) {
        block = slots[size_t(slot)];
        slot_use[size_t(slot)] = ++clock;
      }
      const tiering::ExpertViews v = expert_layout.views(block);
      const device::MatrixRef gu = matrix_ref(v.gate_up, v.gate_up.data, v.gate_up.scales, v.gate_up.biases);
      const device::MatrixRef down = matrix_ref(v.down, v.down.data, v.down.scales, v.down.biases);
      const int64_t m = int64_t(rows_of[size_t(e)].size()), I = v.down.cols;
      const int32_t* idx = rows_dev + offset[size_t(e)];
      device::gather_rows(x, idx, m, H, gathered.as<float>(), stream);
      multiply(gu, gathered.as<float>(), m, ffn.as<float>(), 2 * I, false);
      device::add_bias_rows(ffn.as<float>(), m, 2 * I, 2 * I, v.gate_up_bias, stream);  // gpt-oss (null: none)
      if (c.arch.gpt_oss)
        device::clamped_swiglu(ffn.as<float>(), m, I, act.as<float>(), stream);
      else if (c.arch.gemma4)
        device::gelu_gate(ffn.as<float>(), m, I, act.as<float>(), stream);
      else
        device::silu_gate(ffn.as<float>(), m, I, act.as<float>(), stream);
      multiply(down, act.as<float>(), m, out.as<float>(), H, false);
      device::add_bias_rows(out.as<float>(), m, H, H, v.down_bias, stream);
      device::scatter_add_rows(out.as<float>(), idx, weights_dev + offset[size_t(e)], m, H, h, stream);
      if (slot >= 0) check(cudaEventRecord(slot_free[size_t(slot)], stream), "slot free");
    }
    if (cpu_count > 0) cpu_experts(l, n, h, cpu_count);
  }
};

GpuLayers::GpuLayers(const model::ModelWeights& weights, const GpuOptions& options, int64_t max_chunk,
                     int64_t max_context) {
  check_supported(weights.config, std::clamp<int64_t>(options.layers, 0, weights.config.num_layers));
  if (weights.config.arch.mla && options.layers > 0 && options.kv_codec == GpuKvCodec::q8)
    throw std::invalid_argument("gpu: the q8 device KV is not supported on MLA layers (" + weights.config.model_type +
                                "'s latent KV cache is f16, or f32 in exact mode); use the f16 or f32 device KV");
  if (!gpu_available()) throw std::runtime_error("gpu layers requested but " + gpu_unavailable_reason());
  impl_ = std::make_unique<Impl>(weights, options, max_chunk, max_context);
}
GpuLayers::~GpuLayers() = default;
int64_t GpuLayers::layers() const { return impl_->gpu_layers; }
bool GpuLayers::runs_head() const { return impl_->head; }
void GpuLayers::run(const GpuStep& step) { impl_->run(step); }
bool GpuLayers::embeds_on_device() const { return impl_->embed_on_device; }
void GpuLayers::forget(const void* sequence) {
  cudaStreamSynchronize(impl_->stream);
  const auto it = impl_->sequences.find(sequence);
  if (it != impl_->sequences.end()) impl_->drop(it);
}
int64_t GpuLayers::kv_pages() const { return impl_->pool_pages; }
int64_t GpuLayers::kv_pages_free() const { return int64_t(impl_->free_pages.size()); }
int64_t GpuLayers::kv_ring_pages() const { return impl_->ring_pages; }
int64_t GpuLayers::kv_window_pages() const { return impl_->ring_pool_pages; }
int64_t GpuLayers::kv_window_pages_free() const { return int64_t(impl_->free_ring_pages.size()); }
int64_t GpuLayers::kv_page_positions() { return device::kKvPage; }
int64_t GpuLayers::cached_positions(const void* sequence) const {
  const auto it = impl_->sequences.find(sequence);
  return it == impl_->sequences.end() ? 0 : it->second.filled;
}
tiering::Ledger& GpuLayers::vram_ledger() { return impl_->vram; }
GpuExpertStats GpuLayers::expert_stats() const { return impl_->stats; }
void GpuLayers::set_host_experts(engine::MoeBlock* moe) { impl_->host_moe = moe; }
uint64_t GpuLayers::weight_bytes() const { return impl_->weight_bytes; }
std::string GpuLayers::profile_report() const {
  std::string out;
  double total = 0;
  for (const auto& t : impl_->profile_totals) total += t.second.first;
  const double steps = double(std::max<uint64_t>(impl_->profiled_steps, 1));
  for (const auto& t : impl_->profile_totals) {
    char line[160];
    std::snprintf(line, sizeof line, "    %-28s %9.1f us/step %5.1f%% (%llu calls)\n", t.first.c_str(),
                  1e3 * t.second.first / steps, total > 0 ? 100.0 * t.second.first / total : 0.0,
                  (unsigned long long)t.second.second);
    out += line;
  }
  return out;
}
std::string GpuLayers::setup_report() const {
  std::string out;
  for (size_t i = 0; i < impl_->setup_phases.size(); ++i) {
    const auto& [what, ms] = impl_->setup_phases[i];
    const auto& [used, ledger] = impl_->setup_memory[i];
    out += fmt::format("    {:<28} {:9.1f} ms   device memory in use {:8.1f} MiB, VRAM ledger {:8.1f} MiB\n", what, ms,
                       double(used) / 1048576.0, double(ledger) / 1048576.0);
  }
  return out;
}
void GpuLayers::reset_profile() {
  impl_->profile_totals.clear();
  impl_->profiled_steps = 0;
  impl_->step_ms_total = 0;
  impl_->timed_steps = 0;
}
double GpuLayers::device_step_us() const {
  return impl_->timed_steps ? 1e3 * impl_->step_ms_total / double(impl_->timed_steps) : 0.0;
}

}  // namespace tierlm::gpu

#else  // no CUDA toolkit at build time: the interface exists, the constructor says why it cannot run.

namespace tierlm::gpu {

struct GpuLayers::Impl {};

GpuLayers::GpuLayers(const model::ModelWeights&, const GpuOptions&, int64_t, int64_t) {
  throw std::runtime_error("gpu layers requested but this build has no CUDA backend (no CUDA toolkit was found)");
}
GpuLayers::~GpuLayers() = default;
int64_t GpuLayers::layers() const { return 0; }
bool GpuLayers::runs_head() const { return false; }
void GpuLayers::run(const GpuStep&) {}
bool GpuLayers::embeds_on_device() const { return false; }
void GpuLayers::forget(const void*) {}
int64_t GpuLayers::cached_positions(const void*) const { return 0; }
int64_t GpuLayers::kv_pages() const { return 0; }
int64_t GpuLayers::kv_pages_free() const { return 0; }
int64_t GpuLayers::kv_ring_pages() const { return 0; }
int64_t GpuLayers::kv_window_pages() const { return 0; }
int64_t GpuLayers::kv_window_pages_free() const { return 0; }
int64_t GpuLayers::kv_page_positions() { return 64; }
tiering::Ledger& GpuLayers::vram_ledger() { throw std::runtime_error("no CUDA backend"); }
GpuExpertStats GpuLayers::expert_stats() const { return {}; }
void GpuLayers::set_host_experts(engine::MoeBlock*) {}
uint64_t GpuLayers::weight_bytes() const { return 0; }
std::string GpuLayers::profile_report() const { return {}; }
std::string GpuLayers::setup_report() const { return {}; }
void GpuLayers::reset_profile() {}
double GpuLayers::device_step_us() const { return 0; }

}  // namespace tierlm::gpu

#endif

namespace tierlm::gpu {

namespace {
// The Gated DeltaNet kernels' limits (deltanet_kernels.cuh, which the host-only build does not see; asserted equal).
constexpr int64_t kDeltaNetMaxKernel = 8, kDeltaNetMaxHeadDim = 1024, kDeltaNetMaxStateBytes = 160 << 10;
#ifdef TIERLM_HAVE_CUDA
static_assert(kDeltaNetMaxKernel == device::kDeltaNetMaxKernel && kDeltaNetMaxHeadDim == device::kDeltaNetMaxHeadDim &&
              kDeltaNetMaxStateBytes == device::kDeltaNetMaxStateBytes);
static_assert(kMaxAttentionHeadDim == device::kMaxHeadDim);
#endif
}  // namespace

void GpuLayers::check_supported(const model::ModelConfig& c, int64_t layers) {
  if (layers > 0 && c.arch.gemma4) {
    // Gemma 4's block runs (gemma4_layer): sandwich norms, layer_scalar, GeGLU, v_norm with attention scaling 1.0,
    // per-layer-type RoPE (proportional on full layers), per-layer head_dim / KV heads, attention_k_eq_v, KV-shared
    // layers reading their source's device KV, per-layer inputs, the MoE block beside the dense MLP (routed on the
    // host), embedding scaling and final soft-capping. Refused: heads the attention kernels do not take, and a
    // KV-shared layer on the CPU whose source layer is on the GPU (the host KV cache would not hold its keys).
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const model::LayerSpec l = c.layer(i);
      if (i < layers && (l.head_dim % 16 != 0 || l.head_dim > kMaxAttentionHeadDim))
        throw std::invalid_argument(fmt::format(
            "gpu: {} layer {} has head_dim {} (global_head_dim on full-attention layers), beyond the GPU attention "
            "kernels (a multiple of 16, at most {}); run it on the CPU (--gpu-layers {})", c.model_type, i,
            l.head_dim, kMaxAttentionHeadDim, i));
      if (i >= layers && l.kv_source >= 0 && l.kv_source < layers)
        throw std::invalid_argument(fmt::format(
            "gpu: {} layer {} runs on the CPU but reads layer {}'s KV (num_kv_shared_layers), which runs on the GPU; "
            "put both on the same side (--gpu-layers at most {}, or {})", c.model_type, i, l.kv_source, l.kv_source,
            c.num_layers));
    }
    return;
  }
  // gpt-oss's block runs whole: attention sinks, q/k/v/o biases, YaRN rope (the host's tables), alternating
  // sliding-window layers, the router bias, expert biases with the clamped SwiGLU, MXFP4 experts read packed.
  for (int64_t i = 0; i < layers; ++i) {
    const model::LayerSpec l = c.layer(i);
    if (l.mixer == model::Mixer::gated_deltanet) {  // runs (deltanet_kernels.cuh) within the kernels' limits
      const model::DeltaNetConfig& d = c.deltanet;
      if (d.conv_kernel < 1 || d.conv_kernel > kDeltaNetMaxKernel || d.key_head_dim > kDeltaNetMaxHeadDim ||
          d.value_head_dim > kDeltaNetMaxHeadDim ||
          d.key_head_dim * d.value_head_dim * 4 > kDeltaNetMaxStateBytes)
        throw std::invalid_argument(fmt::format(
            "gpu: layer {} is a Gated DeltaNet layer with linear_conv_kernel_dim {}, linear_key_head_dim {} and "
            "linear_value_head_dim {}, beyond the GPU kernels' limits (kernel <= {}, head dims <= {}, a head's state "
            "<= {} KiB); run it on the CPU (fewer --gpu-layers)", i, d.conv_kernel, d.key_head_dim, d.value_head_dim,
            kDeltaNetMaxKernel, kDeltaNetMaxHeadDim, kDeltaNetMaxStateBytes >> 10));
      continue;
    }
    if (l.mixer != model::Mixer::attention && l.mixer != model::Mixer::sliding_attention &&
        l.mixer != model::Mixer::mla)
      throw std::invalid_argument(fmt::format("gpu: layer {} uses {}, which the GPU backend does not run yet; run it "
                                              "on the CPU (fewer --gpu-layers)", i, model::mixer_name(l.mixer)));
    if (l.full_rope || c.rope_of(i).type != c.rope_of(0).type || c.rope_of(i).theta != c.rope_of(0).theta)
      throw std::invalid_argument(fmt::format("gpu: layer {} has a rope of its own (per-layer-type rope_parameters), "
                                              "which the GPU backend does not apply yet", i));
    if (c.arch.attention_output_gate && c.arch.qkv_bias)
      throw std::invalid_argument(fmt::format("gpu: layer {} is gated attention with q/k/v biases ({}), which the "
                                              "GPU backend does not run yet; run it on the CPU (--gpu-layers 0)",
                                              i, c.model_type));
  }
}

}  // namespace tierlm::gpu
