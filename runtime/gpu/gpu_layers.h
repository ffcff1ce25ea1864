// runtime/gpu/gpu_layers.h — the CUDA backend's one interface to the engine: layers [0, layers) of a model run on
// the GPU (attention with a device KV cache, dense FFN or MoE with a VRAM expert tier), optionally the final norm and
// output head too when every layer is there. Forward calls run() once per step with the embedded rows; the hidden
// state crosses PCIe once (up), and once back (down) or as logits.
// Owns: the device copies of the weights (kept in the host layouts, byte for byte), the paged device KV (pools of
// 64-position pages, allocated once: one for the full-attention layers, where each sequence, keyed by its host
// KVCache, holds a page table shared by those layers (an MLA layer's pages hold its latent rows), and one for the
// sliding-window layers, where it holds a ring bounded to the window plus one step of rows (kv_layer_pages), so a
// long context costs those layers window-sized KV; least recently used sequences outside the current step give their
// pages back when a pool or max_sequences runs out; Gated DeltaNet layers hold no pages but a slot of conv +
// recurrent state per sequence, max_sequences slots a layer, charged to "kv" and given back with the sequence),
// scratch, the VRAM expert tier
// (resident hot experts + LRU slots filled from the host expert cache through pinned staging on a copy stream),
// and a VRAM ledger that every device allocation is charged to. Never: used without a GPU (the constructor throws
// with the reason), or touched by more than one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::engine {
class MoeBlock;
}

namespace tierlm::gpu {

// f32: exact (the CPU's f32 KV; twice f16's VRAM), for checks against transformers at 1e-3.
enum class GpuKvCodec : uint8_t { f16, q8, f32 };

struct GpuOptions {
  int64_t layers = 0;                 // [0, layers) on the GPU; clamped to the model's layer count
  bool head = true;                   // final norm + output head on the GPU when every layer is there
  GpuKvCodec kv_codec = GpuKvCodec::f16;
  // f16/bf16 matrices uploaded as f32 (twice their VRAM): multi-row steps then run f32 GEMMs instead of f16
  // tensor-core ones, which round the activations to f16 (~2e-3 relative on the logits of a bf16 model). With the
  // f32 KV, the exact arithmetic the transformers fixtures are checked against at 1e-3; off for serving. MLX weights
  // (mlx_q4 / mlx_q8, whose semantics are f32 activations) stay packed, and their multi-row GEMMs run in f32 on
  // row chunks dequantized to f32; otherwise those GEMMs split their activations in two f16 parts whatever
  // split_gemm_activations says (the decode matvecs keep f32 activations either way).
  bool widen_dense_weights = false;
  // The multi-row GEMMs' activations as two f16 parts (hi + scaled residual, runtime/gpu/split_f16.cuh), two
  // tensor-core GEMMs instead of one: the activations keep ~22 bits instead of f16's 11, at twice the GEMM flops
  // and no more VRAM for weights. Off by default (prefill speed); see gpu_reference_test's precision breakdown.
  // TIERLM_GPU_SPLIT_GEMM=1 / 0 overrides it (A/B runs).
  bool split_gemm_activations = false;
  int64_t max_sequences = 16;         // sequences whose device KV is kept at once (and at most in one step)
  // Device KV pool, in pages of 64 positions (every full-attention GPU layer has this many; sliding-window layers
  // at most max_sequences rings of kv_ring_pages()). 0: enough for max_sequences full contexts, or as many as the
  // VRAM budget leaves room for (at least one full context, else the constructor throws tiering::LedgerError saying
  // how much is missing).
  int64_t kv_pages = 0;
  uint64_t vram_budget = 0;           // 0: free device memory minus 1 GiB
  // MoE: hot experts kept in VRAM for the whole run, and evictable VRAM slots for the others (0: 4 x top_k).
  std::vector<std::pair<int64_t, int64_t>> resident_experts;  // (layer, expert), layers < `layers`
  int64_t expert_slots = 0;
  // Hybrid MoE placement (llama.cpp's --n-cpu-moe, per expert): in steps of at most this many rows, the routed
  // experts of GPU layers that are not in VRAM (neither resident nor in a slot) run on the CPU, from the host expert
  // cache (RAM, or read from disk), through the MoeBlock given to set_host_experts, while the GPU runs the VRAM
  // experts and the shared expert; only their sum crosses PCIe (rows x hidden floats up, the normed rows down).
  // Decode rows (<= device::kMaxMatvecRows) of a layer with some experts resident route on the device when its
  // kernels take the format (the VRAM ones in the routed kernels), else on the host. Larger steps (prefill) copy
  // them into VRAM slots, where a copy costs less than the CPU's compute. 0: always copy.
  // The planner sets it (Plan::gpu_cpu_expert_rows); TIERLM_GPU_CPU_EXPERT_ROWS=N overrides it (A/B runs).
  int64_t cpu_expert_rows = 0;
  // Programmatic dependent launch (kernels overlap their weight loads with the previous kernel's tail); off only
  // for A/B measurements.
  bool programmatic_launch = true;
  int dense_rows_per_block = 0;       // decode matvec tuning for A/B runs: 0 automatic, 4 or 8
  // Decode matvec of packed weights (8- and 4-bit) on the tensor cores (device::packed_mma_matvec) for matrices of
  // at least 6144 rows (gate_up, the heads, the 8B qkv) and 8-bit ones of at least 8192 columns (down), where it
  // measured faster; the others on the CUDA cores. Off (or TIERLM_GPU_PACKED_MMA=0): every matrix on the CUDA
  // cores; packed_mma_all (or TIERLM_GPU_PACKED_MMA=all): every one the tensor-core kernel can take. Both only for
  // A/B measurements.
  bool packed_mma = true;
  bool packed_mma_all = false;
  // Prefill attention of the f16 device KV (head_dim 64 or 128) on the tensor cores; off (or TIERLM_GPU_PREFILL_MMA=0)
  // runs the CUDA-core kernel the other codecs use, for A/B runs and tests. Both keep f32-like precision.
  bool prefill_attention_mma = true;
  // Head rows computed and staged at once (the logits staging holds this many rows, in VRAM and pinned RAM).
  // 0: as many as fit in 16 MiB (32 rows of a 128K vocabulary), at least 4, at most the chunk.
  int64_t head_rows_per_pass = 0;
  // Diagnostics: device time of whole steps (events at the first upload and after the last copy back), see
  // device_step_us().
  bool time_steps = false;
  // Diagnostics: device time per operation (CUDA events around each launch group), see profile_report().
  bool profile = false;
  // The host ledger: the pinned host memory the backend stages transfers in (hidden rows, step metadata, logits,
  // greedy ids, MoE routing and expert blocks) is charged to it, account "gpu_staging", so the host budget and
  // /health include it (the constructor throws tiering::LedgerError when it does not fit). Null: charged nowhere.
  tiering::Ledger* host_ledger = nullptr;
};

// One step's rows (see GpuLayers::run).
struct GpuStep {
  // n x hidden_size host floats. In: the embedded rows (not read when `tokens` is given and embeds_on_device()).
  // Out: the hidden state after the GPU layers, when !runs_head() (left as it was otherwise).
  float* hidden = nullptr;
  int64_t rows = 0;
  std::span<const int32_t> tokens;            // the rows' token ids (optional)
  std::span<const void* const> sequence;      // rows' sequences (any distinct key each, e.g. their KVCache)
  std::span<const int64_t> positions;
  // Gemma 4 with hidden_size_per_layer_input P: the rows' per-layer inputs as the host computed them from the scaled
  // embeddings (n x num_layers x P floats, engine::Forward::per_layer_inputs); empty otherwise.
  std::span<const float> per_layer_inputs;
  // When runs_head(): head_rows lists the rows whose output is wanted; head_out their logits' destinations (vocab
  // floats each; empty: no logits come back) and head_argmax (empty, or one per head row) the index of each
  // row's largest logit (first on ties, NaN skipped: engine::argmax), reduced on the device so that greedy decode
  // copies back 4 bytes a row instead of the logits.
  std::span<const int32_t> head_rows;
  std::span<float* const> head_out;
  std::span<int32_t> head_argmax;
};

// VRAM expert tier counters.
struct GpuExpertStats {
  uint64_t resident_hits = 0, slot_hits = 0, misses = 0;
  uint64_t bytes_copied = 0;          // host -> VRAM expert bytes
  uint64_t device_routed = 0;         // MoE layer steps routed on the device (<= 4 rows, every expert resident)
  uint64_t cpu_experts = 0;           // (row-group, expert) runs on the CPU (cpu_expert_rows), one per expert a step
};

class GpuLayers {
 public:
  // Ends with a warm-up (dense models; TIERLM_GPU_WARMUP=0 skips it): every prefill GEMM shape, one prefill step and
  // the decode graphs run once on a sequence of its own, so that the first prompt runs at steady speed.
  GpuLayers(const model::ModelWeights& weights, const GpuOptions& options, int64_t max_chunk, int64_t max_context);
  ~GpuLayers();
  // Throws std::invalid_argument naming the first of layers [0, layers) whose LayerSpec the GPU backend does not run
  // yet: a per-layer rope (outside Gemma 4), gated attention with q/k/v biases, Gated DeltaNet layers beyond the
  // kernels' limits (conv kernel <= 8, head dims <= 1024, a value head's state <= 160 KiB), Gemma 4 layers with heads
  // wider than 256 (global_head_dim), and a Gemma 4 KV-shared layer left on the CPU whose source layer is on the GPU.
  // (Sliding-window attention, attention / MLP biases, dense layers among sparse ones, gpt-oss's block, DeepSeek's MLA
  // with its routers, qwen3_5's gated full attention with partial rotary and its Gated DeltaNet layers, and Gemma 4's
  // block run; the constructor refuses the q8 device KV on MLA layers.) The constructor calls it first; callable
  // without a GPU.
  static void check_supported(const model::ModelConfig& config, int64_t layers);
  GpuLayers(const GpuLayers&) = delete;
  GpuLayers& operator=(const GpuLayers&) = delete;

  int64_t layers() const;
  bool runs_head() const;  // layers() == model layers and options.head

  // Runs the GPU layers on step.rows rows of sequences keyed by `sequence[i]` at `positions[i]` (see GpuStep).
  void run(const GpuStep& step);
  // True when the token embedding table is in VRAM anyway (tied to the output head, which is on the GPU), so that
  // run() looks rows up on the device from GpuStep::tokens. Otherwise the host looks them up (one row a token) and
  // uploads them: an untied table is not copied to VRAM for a lookup that reads hidden_size values a token.
  bool embeds_on_device() const;
  // Drops a sequence's device KV (optional: sets past max_sequences are dropped least recently used first).
  void forget(const void* sequence);
  // Positions [0, n) of `sequence` whose K/V the device holds (0 when it holds none, e.g. after the sequence was
  // dropped to make room). A step may write a sequence only from a position <= this (run() throws otherwise), so a
  // caller that reuses a KV prefix (the scheduler's prefix cache) must not reuse more than this on the GPU layers.
  // With Gated DeltaNet layers on the GPU a step must start at 0 or exactly here (their states cannot rewind), with
  // each sequence's rows consecutive positions in consecutive rows.
  // Sliding-window layers also need the window that ends at the reused prefix, which later positions may have taken
  // over in the ring (run() throws then): the ring keeps at least what the host KVCache's ring keeps for a chunk no
  // longer than max_chunk (pages of 64 positions against 32), so KVCache::holds_prefix answers for both.
  int64_t cached_positions(const void* sequence) const;

  // The CPU side of hybrid MoE placement (GpuOptions::cpu_expert_rows): the MoeBlock of the engine that runs the
  // other layers (engine::Forward::use_gpu passes its own), on the same model; null: experts not in VRAM are copied.
  void set_host_experts(engine::MoeBlock* moe);
  tiering::Ledger& vram_ledger();
  GpuExpertStats expert_stats() const;
  uint64_t weight_bytes() const;  // device bytes of the uploaded weights (what one decode step reads)
  // Pages in the full-attention layers' device KV pool (each kv_page_positions() positions of each such layer).
  int64_t kv_pages() const;
  int64_t kv_pages_free() const;
  // The sliding-window layers' pool (VRAM account "kv_windowed"; 0 without such layers): pages, free pages, and the
  // ring a sequence holds at most (kv_layer_pages of the widest window).
  int64_t kv_window_pages() const;
  int64_t kv_window_pages_free() const;
  int64_t kv_ring_pages() const;
  // Device pages one layer holds for a sequence of `context` positions run in steps of at most max_chunk rows: all of
  // them on a full-attention layer (window 0), on a sliding-window layer a ring bounded to the window plus one step
  // (the bound kv::StateSpec gives the host cache, in pages of kv_page_positions()). The planner sizes VRAM with it.
  static int64_t kv_layer_pages(int64_t window, int64_t context, int64_t max_chunk);
  static int64_t kv_page_positions();
  // With options.profile: device milliseconds per operation since the last reset, one line each ("" otherwise).
  std::string profile_report() const;
  void reset_profile();
  // Wall milliseconds of the constructor's phases (context and streams, cuBLAS, uploads, scratch, KV pool, warm-up),
  // one line each.
  std::string setup_report() const;
  // With options.time_steps: mean device microseconds per step (upload to last copy back) since reset_profile().
  double device_step_us() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierlm::gpu
