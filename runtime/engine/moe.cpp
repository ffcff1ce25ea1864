#include "runtime/engine/moe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "runtime/engine/ops.h"
#include "runtime/engine/row_ops.h"

namespace tierlm::engine {

namespace {

tiering::ExpertCache& cache_of(const model::ModelWeights& w) {
  if (!w.experts) throw std::invalid_argument("MoE model loaded without an expert tier");
  return w.experts->cache();
}

// The router's bias (gpt-oss) on n rows of logits.
void add_router_bias(const model::LayerWeights& L, float* logits, int64_t n) {
  const int64_t E = int64_t(L.router_bias.size());
  for (int64_t i = 0; i < n && E > 0; ++i)
    for (int64_t e = 0; e < E; ++e) logits[i * E + e] += L.router_bias[size_t(e)];
}

}  // namespace

kernels::MatmulScratch::Sizes moe_lane_matmul_sizes(kernels::WeightFormat format, int64_t hidden, int64_t intermediate,
                                                    int group_size, int64_t rows) {
  kernels::MatmulScratch::Sizes s = kernels::matmul_scratch_sizes(format, 2 * intermediate, hidden, group_size, rows);
  const kernels::MatmulScratch::Sizes d = kernels::matmul_scratch_sizes(format, hidden, intermediate, group_size, rows);
  for (size_t r = 0; r < s.size(); ++r) s[r] = std::max(s[r], d[r]);
  return s;
}

uint64_t moe_lane_bytes(kernels::WeightFormat format, int64_t hidden, int64_t intermediate, int group_size,
                        int64_t rows) {
  if (rows <= 0 || kernels::matmul_uses_blas(format, kLaneRows)) return 0;
  uint64_t bytes = uint64_t(rows) * uint64_t(hidden + 3 * intermediate) * sizeof(float);
  for (size_t r : moe_lane_matmul_sizes(format, hidden, intermediate, group_size, rows)) bytes += r;
  return bytes;
}

MoeBlock::MoeBlock(const model::ModelWeights& w, kernels::ThreadPool& pool, tiering::Ledger& ledger, int64_t max_rows)
    : w_(w), pool_(pool), cache_(cache_of(w)), max_rows_(max_rows), experts_(w.config.num_experts),
      k_(w.config.num_experts_per_tok), hidden_size_(w.config.hidden_size),
      ffn_width_(std::max(w.config.moe_intermediate_size, w.config.shared_expert_intermediate_size)),
      gate_(w.config.arch.gpt_oss ? clamped_swiglu_interleaved : gate_for(w.config.hidden_act)) {
  logits_ = scratch_floats(ledger, max_rows * experts_);
  ids_ = tiering::LedgerBuffer(ledger, tiering::accounts::scratch, size_t(max_rows * k_) * sizeof(int32_t));
  weights_ = scratch_floats(ledger, max_rows * k_);
  gathered_ = scratch_floats(ledger, max_rows * hidden_size_);
  ffn_ = scratch_floats(ledger, max_rows * 2 * ffn_width_);
  act_ = scratch_floats(ledger, max_rows * ffn_width_);
  out_ = scratch_floats(ledger, max_rows * hidden_size_);
  lookahead_ = scratch_floats(ledger, experts_);
  expert_rows_.resize(size_t(experts_));
  expert_weights_.resize(size_t(experts_));
  for (auto& r : expert_rows_) r.reserve(size_t(max_rows));
  for (auto& r : expert_weights_) r.reserve(size_t(max_rows));
  used_.reserve(size_t(experts_));
  lookahead_ids_.resize(size_t(k_));
  lookahead_weights_.resize(size_t(k_));
  batch_.reserve(size_t(experts_));
  row_views_.reserve(size_t(k_));
  row_tasks_.reserve(size_t(k_));
  const int64_t L = w.config.num_layers;
  expert_layer_.resize(size_t(L));
  next_sparse_.assign(size_t(L), -1);
  for (int64_t i = 0; i < L; ++i) expert_layer_[size_t(i)] = w.config.layer(i).expert_layer;
  for (int64_t i = L - 2; i >= 0; --i)
    next_sparse_[size_t(i)] = expert_layer_[size_t(i + 1)] >= 0 ? i + 1 : next_sparse_[size_t(i + 1)];
  lookahead_layers_ = std::max<int64_t>(1, cache_.options().lookahead_layers);
  route_scratch_.resize(size_t(std::max(pool.size(), 1)));
  const tiering::ExpertLayout& e = cache_.store().layout();
  const int64_t lane_rows = std::min(kLaneRows, max_rows);
  if (moe_lane_bytes(e.format, e.hidden, e.intermediate, e.group_size, lane_rows) > 0) {
    lane_rows_ = lane_rows;
    lane_floats_ = lane_rows * (e.hidden + 3 * e.intermediate);
    const int threads = std::max(pool.size(), 1);
    lanes_ = scratch_floats(ledger, lane_floats_ * threads);
    const kernels::MatmulScratch::Sizes sizes =
        moe_lane_matmul_sizes(e.format, e.hidden, e.intermediate, e.group_size, lane_rows);
    for (int t = 0; t < threads; ++t) {
      lane_scratch_.push_back(std::make_unique<kernels::MatmulScratch>(ledger));
      lane_scratch_.back()->reserve(sizes);
    }
    contributions_ = scratch_floats(ledger, max_rows * k_ * hidden_size_);
    jobs_.reserve(size_t(experts_));
    phase_.reserve(size_t(experts_));
    pieces_.reserve(size_t(experts_ * 4));
  }
}

// The router's scores (softmax over all experts, or DeepSeek-V3's sigmoid), then the k best by the choice scores:
// the scores plus e_score_correction_bias where the layer has one, with every expert outside the topk_group best
// groups set to 0 under group-limited routing (as the definitions' masked_fill(0.0)); ties go to the lower id, as a
// stable sort gives. The weights are the chosen experts' unbiased scores, renormalized when the architecture or
// norm_topk_prob says so, times routed_scaling_factor.
void route_top_k(const model::ModelConfig& config, float* logits, const float* bias, int32_t* ids, float* weights,
                 RouteScratch& scratch) {
  const model::RouterConfig& router = config.router;
  const int64_t experts = config.num_experts, k = config.num_experts_per_tok;
  const bool renormalize = config.arch.moe_renormalize || config.norm_topk_prob;
  float* probs = logits;
  if (router.scoring == model::RouterConfig::Scoring::sigmoid) {
    for (int64_t e = 0; e < experts; ++e) probs[e] = 1.0f / (1.0f + std::exp(-probs[e]));
  } else {
    softmax(probs, experts);
  }
  const float* choice = probs;
  if (bias || router.groups != model::RouterConfig::Groups::none) {
    std::vector<float>& c = scratch.choice;
    c.assign(probs, probs + experts);
    if (bias)
      for (int64_t e = 0; e < experts; ++e) c[size_t(e)] += bias[e];
    if (router.groups != model::RouterConfig::Groups::none) {
      const int64_t groups = router.n_group, per = experts / groups;
      std::vector<float>& score = scratch.group_score;
      score.assign(size_t(groups), 0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        float best = -INFINITY, second = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float x = c[size_t(e)];
          if (x > best) {
            second = best;
            best = x;
          } else if (x > second) {
            second = x;
          }
        }
        score[size_t(g)] = router.groups == model::RouterConfig::Groups::max ? best : best + second;
      }
      std::vector<int32_t>& group_order = scratch.group_order;
      group_order.resize(size_t(groups));
      std::iota(group_order.begin(), group_order.end(), 0);
      std::partial_sort(group_order.begin(), group_order.begin() + router.topk_group, group_order.end(),
                        [&](int32_t a, int32_t b) {
                          const float x = score[size_t(a)], y = score[size_t(b)];
                          return x > y || (x == y && a < b);
                        });
      std::vector<bool>& keep = scratch.group_keep;
      keep.assign(size_t(groups), false);
      for (int64_t g = 0; g < router.topk_group; ++g) keep[size_t(group_order[size_t(g)])] = true;
      for (int64_t e = 0; e < experts; ++e)
        if (!keep[size_t(e / per)]) c[size_t(e)] = 0.0f;
    }
    choice = c.data();
  }
  std::vector<int32_t>& order = scratch.order;
  order.resize(size_t(experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  });
  float sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[size_t(j)];
    weights[j] = probs[order[size_t(j)]];
    sum += weights[j];
  }
  if (renormalize && sum > 0)
    for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
  if (router.routed_scaling_factor != 1.0)
    for (int64_t j = 0; j < k; ++j) weights[j] = float(weights[j] * router.routed_scaling_factor);
}

void MoeBlock::top_k(const float* logits, const float* bias, int32_t* ids, float* weights) const {
  route_top_k(w_.config, const_cast<float*>(logits), bias, ids, weights, route_scratch_[0]);
}

void MoeBlock::route(int64_t layer, const float* x, int64_t n) {
  const model::LayerWeights& L = w_.layers[size_t(layer)];
  const int64_t expert_layer = expert_layer_[size_t(layer)];
  int32_t* ids = ids_.as<int32_t>();
  float* weights = weights_.as<float>();
  if (override_) {
    for (int64_t i = 0; i < n; ++i)
      override_(expert_layer, i, std::span(ids + i * k_, size_t(k_)), std::span(weights + i * k_, size_t(k_)));
  } else {
    float* logits = logits_.as<float>();
    multiply(L.router.view, x, n, logits, pool_);
    add_router_bias(L, logits, n);
    const float* bias = L.score_correction_bias.empty() ? nullptr : L.score_correction_bias.data();
    // A prefill chunk's rows choose their experts on the pool, each thread with its own scratch: route() took
    // 3.7-4.2 ms of a 128-row chunk's ~60 ms at 16 threads on the device's Xeon, its router GEMM already on the
    // pool and the top-k of every row on the calling thread. A few rows choose here.
    auto choose = [&](int64_t begin, int64_t end, int thread) {
      for (int64_t i = begin; i < end; ++i)
        route_top_k(w_.config, logits + i * experts_, bias, ids + i * k_, weights + i * k_,
                    route_scratch_[size_t(thread)]);
    };
    if (n >= kParallelRouteRows)
      pool_.parallel_for(n, choose);
    else
      choose(0, n, 0);
    if (!L.per_expert_scale.empty())
      for (int64_t j = 0; j < n * k_; ++j) weights[j] *= L.per_expert_scale[size_t(ids[j])];
  }
  if (observer_) observer_(expert_layer, n, std::span<const int32_t>(ids, size_t(n * k_)));
  group(ids, weights, n, k_);
}

void MoeBlock::group(const int32_t* ids, const float* weights, int64_t n, int64_t k) {
  for (int32_t e : used_) {
    expert_rows_[size_t(e)].clear();
    expert_weights_[size_t(e)].clear();
  }
  used_.clear();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[i * k + j];
      if (e == kNotHere) continue;
      if (e < 0 || e >= experts_) throw std::out_of_range("router chose an expert that does not exist");
      if (expert_rows_[size_t(e)].empty()) used_.push_back(e);
      expert_rows_[size_t(e)].push_back(int32_t(i));
      expert_weights_[size_t(e)].push_back(weights[i * k + j]);
    }
}

void MoeBlock::run_expert(const tiering::ExpertViews& e, std::span<const int32_t> rows,
                          std::span<const float> row_weights, const float* x, float* hidden) {
  const int64_t H = hidden_size_, m = int64_t(rows.size());
  float* out = out_.as<float>();
  expert_rows(e, rows, x, gathered_.as<float>(), ffn_.as<float>(), act_.as<float>(), out, pool_);
  for (int64_t r = 0; r < m; ++r) {
    float* h = hidden + int64_t(rows[size_t(r)]) * H;
    const float* y = out + r * H;
    const float wgt = row_weights[size_t(r)];
    for (int64_t j = 0; j < H; ++j) h[j] += wgt * y[j];
  }
}

size_t MoeBlock::run_resident_row_experts(int64_t el, std::span<const int32_t> batch, const float* x,
                                          float* hidden) {
  // ffn_, act_ and out_ hold max_rows_ rows: one row of each expert here.
  size_t m = 0;
  while (m < batch.size() && int64_t(m) < max_rows_ && cache_.resident(el, batch[m])) ++m;
  if (m < 2) return 0;
  // Resident experts: acquire never waits or throws, and release is a no-op; the caller releases the whole batch
  // if anything here throws. Every expert's views come from the store's one layout: one format and shape.
  row_views_.clear();
  for (size_t j = 0; j < m; ++j) row_views_.push_back(cache_.acquire(el, batch[j], &pool_));
  const int64_t H = hidden_size_, I = row_views_[0].down.cols;
  float* ffn = ffn_.as<float>();
  float* act = act_.as<float>();
  float* out = out_.as<float>();
  row_tasks_.clear();
  for (size_t j = 0; j < m; ++j) row_tasks_.push_back({&row_views_[j].gate_up, x, ffn + int64_t(j) * 2 * I});
  kernels::matvec_batch(row_tasks_, pool_);
  for (size_t j = 0; j < m; ++j) gate_row(row_views_[j], ffn + int64_t(j) * 2 * I, act + int64_t(j) * I);
  row_tasks_.clear();
  for (size_t j = 0; j < m; ++j)
    row_tasks_.push_back({&row_views_[j].down, act + int64_t(j) * I, out + int64_t(j) * H});
  kernels::matvec_batch(row_tasks_, pool_);
  for (size_t j = 0; j < m; ++j) {  // run_expert's weighted add, expert by expert
    float* y = out + int64_t(j) * H;
    add_down_bias(row_views_[j], y, 1);
    const float wgt = expert_weights_[size_t(batch[j])][0];
    for (int64_t c = 0; c < H; ++c) hidden[c] += wgt * y[c];
  }
  for (size_t j = 0; j < m; ++j) cache_.release(el, batch[j]);
  ++together_runs_;
  return m;
}

void MoeBlock::gate_row(const tiering::ExpertViews& e, float* ffn, float* act) const {
  const int64_t I = e.down.cols;
  if (e.gate_up_bias)
    for (int64_t j = 0; j < 2 * I; ++j) ffn[j] += e.gate_up_bias[j];
  gate_(ffn, I, act);
}

void MoeBlock::add_down_bias(const tiering::ExpertViews& e, float* out, int64_t rows) const {
  if (!e.down_bias) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < hidden_size_; ++j) out[r * hidden_size_ + j] += e.down_bias[j];
}

void MoeBlock::expert_rows(const tiering::ExpertViews& e, std::span<const int32_t> rows, const float* x,
                           float* gathered, float* ffn, float* act, float* out, kernels::ThreadPool& pool) const {
  const int64_t H = hidden_size_, I = e.down.cols, m = int64_t(rows.size());
  const float* input = x + int64_t(rows[0]) * H;
  if (m > 1) {  // gather the rows that chose this expert so its weights are read once for all of them
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(gathered + r * H, x + int64_t(rows[size_t(r)]) * H, size_t(H) * sizeof(float));
    input = gathered;
  }
  multiply(e.gate_up, input, m, ffn, pool);
  auto gate_rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) gate_row(e, ffn + r * 2 * I, act + r * I);
  };
  // The gate over a prefill chunk's rows on the pool: on the calling thread alone it was a quarter to a third of
  // MoE prefill at 16 threads (20-28 ms of a 128-row chunk's 48-59 ms of experts on the device's Xeon, the other
  // threads waiting). A decode row's gate stays here (one dispatch costs more than it).
  if (m * I >= kParallelGateElements && pool.size() > 1)
    pool.parallel_for(m, [&](int64_t begin, int64_t end, int) { gate_rows(begin, end); });
  else
    gate_rows(0, m);
  multiply(e.down, act, m, out, pool);
  add_down_bias(e, out, m);
}

void MoeBlock::run_jobs(std::span<const int32_t> jobs, const float* x) {
  const int64_t H = hidden_size_;
  float* contributions = contributions_.as<float>();
  pieces_.clear();
  int64_t total = 0;
  for (int32_t j : jobs) total += int64_t(expert_rows_[size_t(jobs_[size_t(j)].expert)].size());
  if (total == 0) return;
  // Pieces of at most `piece` rows (a lane's buffers hold lane_rows_), at least kLanePieces per lane where the rows
  // allow: a 16-core pool with 32 experts of ~16 rows has two experts a lane, and their uneven rows left lanes idle,
  // while a popular expert's 40-60 rows split over the whole pool ran alone (one MoE layer of fit_accuracy_bench's
  // model: 3.2-3.4 ms routed by its router against 2.0-2.1 ms with every expert 16 rows, the device's Xeon). A
  // piece multiplies its rows as the whole expert would (row by row the same sums). Pieces are multiples of
  // kLanePieceRows (the q4/q8 kernels' row tile) but an expert's last, so cutting adds no tile pass: 21 rows as
  // 8 + 8 + 5 take the tiles the whole expert takes (8, 8, 4, 1), where 7 + 7 + 7 would take 4, 2, 1 three times.
  const int64_t lanes = int64_t(lane_scratch_.size());
  const int64_t piece = lane_piece_rows(total, lanes, lane_rows_);
  for (int32_t j : jobs) {
    const int64_t m = int64_t(expert_rows_[size_t(jobs_[size_t(j)].expert)].size());
    for (int64_t b = 0; b < m; b += piece) pieces_.push_back({j, int32_t(b), int32_t(std::min(m, b + piece))});
  }
  // Most rows first, so the last pieces to start are the short ones (threads finish together).
  std::stable_sort(pieces_.begin(), pieces_.end(),
                   [](const Piece& a, const Piece& b) { return a.end - a.begin > b.end - b.begin; });
  std::atomic<size_t> next{0};
  pool_.parallel_for(std::min<int64_t>(lanes, int64_t(pieces_.size())), [&](int64_t, int64_t, int thread) {
    kernels::MatmulScratch::Scope scope(*lane_scratch_[size_t(thread)]);
    float* gathered = lanes_.as<float>() + int64_t(thread) * lane_floats_;
    float* ffn = gathered + lane_rows_ * H;
    float* act = ffn + lane_rows_ * 2 * cache_.store().layout().intermediate;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < pieces_.size();
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const Piece& p = pieces_[i];
      const Job& job = jobs_[size_t(p.job)];
      const std::span<const int32_t> rows(expert_rows_[size_t(job.expert)]);
      expert_rows(job.views, rows.subspan(size_t(p.begin), size_t(p.end - p.begin)), x, gathered, ffn, act,
                  contributions + (job.offset + p.begin) * H, serial_);
    }
  });
}

void MoeBlock::run_batch_on_lanes(int64_t el, std::span<const int32_t> batch, const float* x, float* hidden) {
  const int64_t H = hidden_size_;
  try {
    for (int in_memory = 1; in_memory >= 0; --in_memory) {
      phase_.clear();
      for (size_t j = 0; j < jobs_.size(); ++j) {
        if (jobs_[j].in_memory != bool(in_memory)) continue;
        jobs_[j].views = cache_.acquire(el, jobs_[j].expert, &pool_);
        phase_.push_back(int32_t(j));
      }
      run_jobs(phase_, x);
    }
  } catch (...) {
    // An expert that could not be loaded (ReaderError) fails this step; the batch is released, so the cache serves
    // the next step with every slot (the failed one's release is a no-op).
    for (int32_t e : batch) cache_.release(el, e);
    throw;
  }
  for (int32_t e : batch) cache_.release(el, e);
  // The outputs into the residual, expert by expert in batch order (run_expert's order), a range of columns per
  // thread.
  const float* contributions = contributions_.as<float>();
  auto add = [&](int64_t c0, int64_t c1) {
    for (const Job& job : jobs_) {
      const std::vector<int32_t>& rows = expert_rows_[size_t(job.expert)];
      const std::vector<float>& weights = expert_weights_[size_t(job.expert)];
      for (size_t r = 0; r < rows.size(); ++r) {
        float* h = hidden + int64_t(rows[r]) * H;
        const float* y = contributions + (job.offset + int64_t(r)) * H;
        const float wgt = weights[r];
        for (int64_t j = c0; j < c1; ++j) h[j] += wgt * y[j];
      }
    }
  };
  const int64_t blocks = (H + 63) / 64;
  pool_.parallel_for(blocks, [&](int64_t b, int64_t e, int) { add(b * 64, std::min(H, e * 64)); });
}

void MoeBlock::shared_expert(const model::LayerWeights& L, const float* x, int64_t n, float* hidden) {
  const int64_t H = hidden_size_, S = w_.config.shared_expert_intermediate_size;  // gated (qwen2_moe) or not
  float* ffn = ffn_.as<float>();
  float* act = act_.as<float>();
  float* out = out_.as<float>();
  multiply(L.shared_gate_up.view, x, n, ffn, pool_);
  for (int64_t i = 0; i < n; ++i) silu_gate(ffn + i * 2 * S, S, act + i * S);
  multiply(L.shared_down.view, act, n, out, pool_);
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;
    for (size_t j = 0; j < L.shared_expert_gate.size(); ++j)
      z += double(L.shared_expert_gate[j]) * x[i * H + int64_t(j)];
    const float g = L.shared_expert_gate.empty() ? 1.0f : float(1.0 / (1.0 + std::exp(-z)));
    for (int64_t j = 0; j < H; ++j) hidden[i * H + j] += g * out[i * H + j];
  }
}

void MoeBlock::accumulate(int64_t layer, const float* x, int64_t n, float* hidden, const float* route_x) {
  if (n > max_rows_) throw std::invalid_argument("moe: more rows than the block was sized for");
  const int64_t el = expert_layer_.at(size_t(layer));
  if (el < 0) throw std::logic_error("moe: accumulate on a dense layer");
  if (!route_x) route_x = x;
  using clock = std::chrono::steady_clock;
  const clock::time_point entered = clock::now();
  route(layer, route_x, n);
  const double computing = run_grouped(layer, el, x, n, hidden, route_x, prefetch_);
  if (w_.layers[size_t(layer)].shared_down.view.rows) shared_expert(w_.layers[size_t(layer)], x, n, hidden);
  cache_.add_moe_time(std::chrono::duration<double>(clock::now() - entered).count(), computing);
}

void MoeBlock::accumulate_routed(int64_t layer, const float* x, int64_t n, std::span<const int32_t> ids,
                                 std::span<const float> weights, float* hidden) {
  if (n > max_rows_) throw std::invalid_argument("moe: more rows than the block was sized for");
  const int64_t el = expert_layer_.at(size_t(layer));
  if (el < 0) throw std::logic_error("moe: accumulate_routed on a dense layer");
  if (n <= 0) return;
  const int64_t k = int64_t(ids.size()) / n;
  if (k * n != int64_t(ids.size()) || weights.size() != ids.size() || k > k_)
    throw std::invalid_argument("moe: accumulate_routed takes n rows of at most top_k choices");
  using clock = std::chrono::steady_clock;
  const clock::time_point entered = clock::now();
  group(ids.data(), weights.data(), n, k);
  const double computing = run_grouped(layer, el, x, n, hidden, x, /*prefetch=*/false);
  cache_.add_moe_time(std::chrono::duration<double>(clock::now() - entered).count(), computing);
}

double MoeBlock::run_grouped(int64_t layer, int64_t el, const float* x, int64_t n, float* hidden,
                             const float* route_x, bool prefetch) {
  using clock = std::chrono::steady_clock;
  clock::duration computing{};
  // Experts in memory first: while they compute, the reads of the missing ones are in flight.
  std::stable_partition(used_.begin(), used_.end(), [&](int32_t e) { return cache_.cached(el, e); });
  bool prefetched = false;
  size_t next = 0;
  std::vector<int32_t>& batch = batch_;
  const int64_t next_layer = next_sparse_[size_t(layer)];
  while (next < used_.size()) {
    // As many experts as there are unpinned slots (resident experts need none).
    const int64_t room = std::max<int64_t>(1, cache_.available_slots());
    batch.clear();
    int64_t slots = 0;
    while (next < used_.size()) {
      const int32_t e = used_[next];
      const bool needs_slot = !cache_.resident(el, e);
      if (needs_slot && slots == room) break;
      slots += needs_slot;
      batch.push_back(e);
      ++next;
    }
    const bool on_lanes = n > 1 && lanes();
    if (on_lanes) {
      jobs_.clear();
      int64_t offset = 0;
      for (int32_t e : batch) {
        jobs_.push_back(Job{{}, e, offset, cache_.cached(el, e)});
        offset += int64_t(expert_rows_[size_t(e)].size());
      }
    }
    cache_.request(el, batch);
    if (on_lanes) {
      const clock::time_point started = clock::now();
      run_batch_on_lanes(el, batch, x, hidden);
      computing += clock::now() - started;  // the lanes' waits for reads included: prefill's, not decode's
      continue;
    }
    if (!prefetched && prefetch && n == 1 && !override_ && next_layer >= 0) {
      // Lookahead: the residual stream changes slowly, so a later sparse layer's router on this input predicts its
      // choice: the next one first, then as many more as the cache's lookahead_layers (nearest first, so their
      // reads queue in the order they are needed).
      float* logits = lookahead_.as<float>();
      int64_t ahead = next_layer;
      for (int64_t d = 0; d < lookahead_layers_ && ahead >= 0; ++d, ahead = next_sparse_[size_t(ahead)]) {
        const model::LayerWeights& next = w_.layers[size_t(ahead)];
        kernels::matvec(next.router.view, route_x, logits, pool_);
        add_router_bias(next, logits, 1);
        top_k(logits, next.score_correction_bias.empty() ? nullptr : next.score_correction_bias.data(),
              lookahead_ids_.data(), lookahead_weights_.data());
        cache_.prefetch(expert_layer_[size_t(ahead)], lookahead_ids_);
      }
    }
    prefetched = true;
    size_t done = 0;
    try {
      if (n == 1 && together_ && kernels::matvec_batch_supported(cache_.store().layout().format)) {
        const clock::time_point started = clock::now();
        done = run_resident_row_experts(el, batch, x, hidden);
        if (done) computing += clock::now() - started;
      }
      for (; done < batch.size(); ++done) {
        const int32_t e = batch[done];
        const tiering::ExpertViews views = cache_.acquire(el, e, &pool_);
        const clock::time_point started = clock::now();
        run_expert(views, expert_rows_[size_t(e)], expert_weights_[size_t(e)], x, hidden);
        computing += clock::now() - started;
        cache_.release(el, e);
      }
    } catch (...) {
      // An expert that could not be loaded (ReaderError) fails this step; the experts of the batch still pinned
      // are released, so the cache serves the next step with every slot (the failed one's release is a no-op).
      for (size_t j = done; j < batch.size(); ++j) cache_.release(el, batch[j]);
      throw;
    }
  }
  return std::chrono::duration<double>(computing).count();
}

}  // namespace tierlm::engine
