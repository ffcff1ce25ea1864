// runtime/engine/moe.h — the sparse MLP of a mixture-of-experts layer: router matvec, softmax (or DeepSeek-V3's
// sigmoid with its score-correction bias and group-limited choice: ModelConfig::router), top-k (renormalized
// when the architecture or norm_topk_prob says so, then scaled per expert where the layer has per_expert_scale,
// as Gemma 4, or by routed_scaling_factor), each chosen expert fetched from the ExpertCache and applied to
// the rows that chose it, weighted sum into the residual; plus qwen2_moe's shared expert behind a sigmoid gate (or
// DeepSeek's ungated shared experts).
// Experts already in memory run first so the reads of missing ones overlap their compute; for decode, the next
// layer's router applied to this layer's input predicts its experts, and their reads start before this layer's
// compute (prefetch).
// Layers are the model's (w.layers index); the expert tier, the routing override and the observer see the layer's
// expert-tier index (LayerSpec::expert_layer), which differs when dense layers sit among sparse ones.
// Owns: routing scratch (ledger account "scratch"). Never: allocate per step, hold an expert past its use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "runtime/engine/ops.h"
#include "runtime/kernels/matmul_scratch.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

// The routing scratch reused between route_top_k calls (no allocation per row once grown).
struct RouteScratch {
  std::vector<int32_t> order, group_order;
  std::vector<float> choice, group_score;
  std::vector<bool> group_keep;
};

// One row's routing as MoeBlock applies it, for any backend that routes on the host (the GPU layers' host routing
// calls it too, so routing lives in one place): `logits` (num_experts floats, turned into the scores in place) ->
// the num_experts_per_tok expert ids and weights. bias: the layer's e_score_correction_bias or null.
void route_top_k(const model::ModelConfig& config, float* logits, const float* bias, int32_t* ids, float* weights,
                 RouteScratch& scratch);

// An expert's rows x intermediate from which its gate runs on the pool rather than the calling thread (~5 ns an
// element serial on the device's Xeon: 4096 are ~20 us, several dispatches' worth).
inline constexpr int64_t kParallelGateElements = 4096;
// Rows from which a chunk's routing (top-k per row) runs on the pool.
inline constexpr int64_t kParallelRouteRows = 16;
// Prefill's experts run on lanes: a chunk's rows spread over many experts (128 rows x top-8 over 128 experts: ~8
// rows each), and one expert's GEMMs split over the pool paid three dispatches and a serial activation pass for a
// few microseconds of work per thread. Instead each pool thread takes pieces of experts (up to this many of an
// expert's rows), one after another (most rows first), on a serial pool with its own buffers and MatmulScratch, and
// writes their outputs apart; they are added to the residual afterwards in the order run_expert adds them (the same
// sums, bit for bit). Not for experts whose matmul calls OpenBLAS (dense experts on a CPU without AVX-512).
inline constexpr int64_t kLaneRows = 32;
// The lanes' experts are cut into pieces of rows, kLanePieces per lane where the rows allow, each a multiple of
// kLanePieceRows rows (the q4/q8 kernels' activation-row tile) but an expert's last.
inline constexpr int64_t kLanePieces = 4;
inline constexpr int64_t kLanePieceRows = 8;
// The scratch bytes of one lane for experts of this shape (hidden H, intermediate I, the slot format) at up to
// `rows` rows: its gathered input, gate_up output and activation, and its MatmulScratch. 0 where the format takes no
// lanes. Linear in rows: the planner charges threads x min(kLaneRows, step rows) x its one-row bytes.
uint64_t moe_lane_bytes(kernels::WeightFormat format, int64_t hidden, int64_t intermediate, int group_size,
                        int64_t rows);
// The MatmulScratch one lane reserves: the larger of its gate_up's and down's needs at `rows`, region by region.
kernels::MatmulScratch::Sizes moe_lane_matmul_sizes(kernels::WeightFormat format, int64_t hidden, int64_t intermediate,
                                                    int group_size, int64_t rows);
// The rows of a lane's piece when `total` rows of experts are cut for `lanes` lanes whose buffers hold `lane_rows`:
// kLanePieces a lane where the rows allow, a multiple of kLanePieceRows, at most lane_rows.
inline int64_t lane_piece_rows(int64_t total, int64_t lanes, int64_t lane_rows) {
  const int64_t wanted = std::max<int64_t>((total + kLanePieces * lanes - 1) / (kLanePieces * lanes), 1);
  return std::min(lane_rows, (wanted + kLanePieceRows - 1) / kLanePieceRows * kLanePieceRows);
}

class MoeBlock {
 public:
  // Fills one row's top-k expert ids and weights in place of the router (synthetic routing for benchmarks).
  using RoutingOverride =
      std::function<void(int64_t layer, int64_t row, std::span<int32_t> experts, std::span<float> weights)>;
  // Sees each step's routing after the router (or the override) ran: n rows x top_k expert ids, row-major. For
  // calibration's router traces; it must not keep the span.
  using RoutingObserver = std::function<void(int64_t layer, int64_t n, std::span<const int32_t> experts)>;

  MoeBlock(const model::ModelWeights& weights, kernels::ThreadPool& pool, tiering::Ledger& ledger, int64_t max_rows);

  // hidden[i] += MoE_layer(x[i]) for the n rows (x and hidden: n x hidden_size); `layer` must be a sparse one.
  // route_x: what the router sees when it differs from the experts' input (Gemma 4); null: x.
  void accumulate(int64_t layer, const float* x, int64_t n, float* hidden, const float* route_x = nullptr);

  // The routed experts of a routing made elsewhere (the GPU layers' host routing, which runs the experts that are
  // not in VRAM here: GpuOptions::cpu_expert_rows): ids and weights hold n rows of the same number of choices (at
  // most top_k), kNotHere marking a choice that is not this call's (an expert the caller runs itself). hidden[i] +=
  // the weighted sum of row i's experts here, through the expert cache as accumulate does (memory first, reads of
  // the rest overlapped, prefill on the lanes), without the router, the shared expert or prefetch.
  static constexpr int32_t kNotHere = -1;
  void accumulate_routed(int64_t layer, const float* x, int64_t n, std::span<const int32_t> ids,
                         std::span<const float> weights, float* hidden);

  void set_routing_override(RoutingOverride fn) { override_ = std::move(fn); }
  void set_routing_observer(RoutingObserver fn) { observer_ = std::move(fn); }
  void set_prefetch(bool on) { prefetch_ = on; }
  // Prefill's experts on lanes (kLaneRows; on by default where the experts' format takes them) or each split over
  // the pool, the comparison baseline.
  void set_lanes(bool on) { lanes_on_ = on; }
  // A decode row's resident experts together (run_resident_row_experts; on by default), or one after another (the
  // baseline of tests and benches).
  void set_row_experts_together(bool on) { together_ = on; }
  int64_t row_experts_together_runs() const { return together_runs_; }  // how often they ran together
  bool lanes() const { return lane_rows_ > 0 && lanes_on_; }
  bool prefetch() const { return prefetch_; }

 private:
  void route(int64_t layer, const float* x, int64_t n);
  // used_, expert_rows_ and expert_weights_ from n rows of k choices (kNotHere skipped).
  void group(const int32_t* ids, const float* weights, int64_t n, int64_t k);
  // The grouped experts of the step (expert-tier layer el) into hidden; returns the seconds spent computing.
  double run_grouped(int64_t layer, int64_t el, const float* x, int64_t n, float* hidden, const float* route_x,
                     bool prefetch);
  // bias: the layer's e_score_correction_bias (num_experts floats) or null.
  void top_k(const float* logits, const float* bias, int32_t* ids, float* weights) const;
  void run_expert(const tiering::ExpertViews& e, std::span<const int32_t> rows, std::span<const float> row_weights,
                  const float* x, float* hidden);
  // A decode row's resident experts at the head of a batch, together (kernels::matvec_batch, which the experts'
  // format must take: their gate_ups in one dispatch, their downs in another, where one after another each took
  // two), added to hidden in batch order: the same sums as run_expert on each. Returns how many it ran (0: fewer
  // than two). It acquires and releases them itself; if it throws, the caller releases the batch.
  size_t run_resident_row_experts(int64_t expert_layer, std::span<const int32_t> batch, const float* x, float* hidden);
  // One row's gate: the gate_up bias (gpt-oss), then the activation of ffn (2I) into act (I).
  void gate_row(const tiering::ExpertViews& e, float* ffn, float* act) const;
  // The down bias (gpt-oss) on `rows` output rows of hidden_size.
  void add_down_bias(const tiering::ExpertViews& e, float* out, int64_t rows) const;
  // The expert's output for its rows into out (rows x hidden_size): gather, gate_up, gate, down, biases, on `pool`
  // with the given buffers (gathered: rows x H, ffn: rows x 2I, act: rows x I).
  void expert_rows(const tiering::ExpertViews& e, std::span<const int32_t> rows, const float* x, float* gathered,
                   float* ffn, float* act, float* out, kernels::ThreadPool& pool) const;
  // One batch of a prefill step (its experts requested and pinned): the experts that were in memory before the
  // request first, then the rest as their reads land, in pieces on the lanes; then
  // their outputs added to hidden in batch order. Releases the batch, also when an acquire throws.
  void run_batch_on_lanes(int64_t expert_layer, std::span<const int32_t> batch, const float* x, float* hidden);
  void run_jobs(std::span<const int32_t> jobs, const float* x);
  void shared_expert(const model::LayerWeights& L, const float* x, int64_t n, float* hidden);

  const model::ModelWeights& w_;
  kernels::ThreadPool& pool_;
  tiering::ExpertCache& cache_;
  int64_t max_rows_, experts_, k_, hidden_size_, ffn_width_;
  GateFn gate_;  // the experts' activation (SiLU, or Gemma 4's GeLU-tanh)
  bool prefetch_ = true;
  int64_t lookahead_layers_ = 1;  // the cache's lookahead_layers, at least 1
  RoutingOverride override_;
  RoutingObserver observer_;
  tiering::LedgerBuffer logits_, ids_, weights_, gathered_, ffn_, act_, out_, lookahead_;
  // Per expert: the rows (and their weights) that chose it in this step.
  std::vector<std::vector<int32_t>> expert_rows_;
  std::vector<std::vector<float>> expert_weights_;
  std::vector<int32_t> used_, batch_, lookahead_ids_;
  // One per pool thread (a prefill chunk's rows are routed in parallel); the calling thread's own choices use [0].
  mutable std::vector<RouteScratch> route_scratch_;
  std::vector<float> lookahead_weights_;
  std::vector<int64_t> expert_layer_;  // per model layer: its expert-tier index, -1 for dense layers
  std::vector<int64_t> next_sparse_;   // per model layer: the next sparse model layer, -1 when none
  // Lanes (kLaneRows): rows an expert may have to run on one (0: none), each lane's floats, the serial pool they
  // multiply on, one MatmulScratch per pool thread, and the outputs of a batch's experts (max_rows x k rows).
  int64_t lane_rows_ = 0, lane_floats_ = 0;
  bool lanes_on_ = true;
  bool together_ = true;
  int64_t together_runs_ = 0;
  kernels::ThreadPool serial_{1, false};
  std::vector<std::unique_ptr<kernels::MatmulScratch>> lane_scratch_;
  tiering::LedgerBuffer lanes_, contributions_;
  struct Job {
    tiering::ExpertViews views;
    int32_t expert = 0;
    int64_t offset = 0;  // its first output row in contributions_
    bool in_memory = false;  // cached before the batch's request
  };
  std::vector<Job> jobs_;
  struct Piece {
    int32_t job, begin, end;  // rows [begin, end) of jobs_[job]'s expert
  };
  std::vector<int32_t> phase_;
  std::vector<Piece> pieces_;
  std::vector<tiering::ExpertViews> row_views_;  // run_resident_row_experts' experts
  std::vector<kernels::MatvecTask> row_tasks_;
};

}  // namespace tierlm::engine
