// calibrate/planner.cpp — the decisions and the cost model behind make_plan (written out in calibrate/README.md).
#include "calibrate/planner.h"

#include <algorithm>
#include <cmath>
#include <list>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "runtime/engine/moe.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/kernels/weights.h"
#include "runtime/kv/codec.h"

namespace tierlm::calibrate {

namespace {

constexpr double kMiB = double(1 << 20);

const ComputeSample* sample_for_threads(const DeviceProfile& d, int threads) {
  const ComputeSample* best = nullptr;
  for (auto& c : d.compute)
    if (c.threads <= threads && (!best || c.threads > best->threads)) best = &c;
  return best ? best : (d.compute.empty() ? nullptr : &d.compute.front());
}

// Decode streams weights through matvec: its measured GB/s for the format (f16 and bf16 probed since their
// widening kernels run well below q8's rate; f32, and f16/bf16 in profiles without those probes, at q8's rate).
double matvec_gbs(const DeviceProfile& d, int threads, const std::string& format) {
  const ComputeSample* c = sample_for_threads(d, threads);
  const double read = std::max(d.read_gbs(), 0.1);
  if (!c) return read * 0.7;
  if (format == "q4" || format == "mlx_q4") return std::max(c->matvec_q4_gbs, 0.05);
  if (format == "f16" && c->matvec_f16_gbs > 0) return c->matvec_f16_gbs;
  if (format == "bf16" && c->matvec_bf16_gbs > 0) return c->matvec_bf16_gbs;
  if (format == "f32" && c->matvec_f32_gbs > 0) return c->matvec_f32_gbs;
  return std::max(c->matvec_q8_gbs, 0.05);
}

// Storage bandwidth for reads of `block` with up to `depth` in flight: the sweep at that block size, made
// non-decreasing in depth (more reads in flight never serve fewer bytes; where a shallower cell measured faster, the
// two were noise around one rate and are pooled: an isotonic fit), at the deepest measured depth not above `depth`.
// One cell alone swung 1.3-1.9 GB/s between quick sweeps a minute apart on the device's virtual disk, depth 1 above
// depth 8 as often as below.
double storage_gbs(const StorageInfo& storage, uint64_t block, unsigned depth) {
  std::vector<const StorageSample*> cells;
  for (auto& s : storage.sweep)
    if (s.block_size == block) cells.push_back(&s);
  if (!cells.empty()) {
    std::sort(cells.begin(), cells.end(),
              [](const StorageSample* a, const StorageSample* b) { return a->queue_depth < b->queue_depth; });
    // Pool adjacent violators: blocks of cells with their mean rate, each block's mean above the previous one's.
    struct Pool {
      double sum = 0;
      int count = 0;
      double mean() const { return sum / count; }
    };
    std::vector<Pool> pools;
    for (size_t i = 0; i < cells.size(); ++i) {
      pools.push_back({cells[i]->gbs, 1});
      while (pools.size() > 1 && pools[pools.size() - 2].mean() > pools.back().mean()) {
        pools[pools.size() - 2].sum += pools.back().sum;
        pools[pools.size() - 2].count += pools.back().count;
        pools.pop_back();
      }
    }
    // The pooled rate of the deepest cell not above `depth` (the shallowest when all are deeper).
    size_t chosen = 0;
    for (size_t i = 0; i < cells.size(); ++i)
      if (cells[i]->queue_depth <= depth) chosen = i;
    size_t first = 0;
    for (const Pool& p : pools) {
      if (chosen < first + size_t(p.count)) return std::max(p.mean(), 1e-3);
      first += size_t(p.count);
    }
  }
  // No cell of that block size: the nearest block size's first cell.
  const StorageSample* best = nullptr;
  for (auto& s : storage.sweep)
    if (!best || std::abs(double(s.block_size) - double(block)) < std::abs(double(best->block_size) - double(block)))
      best = &s;
  return best ? std::max(best->gbs, 1e-3) : 0.1;
}

double storage_gbs(const DeviceProfile& d, uint64_t block, unsigned depth) {
  return storage_gbs(d.storage, block, depth);
}

// Expected distinct experts a step of `rows` tokens touches in a layer.
double distinct_experts(const std::vector<double>& freq, int64_t rows) {
  double d = 0;
  for (double f : freq) d += 1.0 - std::pow(1.0 - std::min(f, 1.0), double(rows));
  return d;
}

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// One row of one of the MoE block's prefill lanes (engine::moe_lane_bytes, linear in its rows; a lane per pool
// thread): measured on the model, else from the shape at the smallest MLX group (the most group sums); 0 for a
// dense model or experts that take no lanes.
uint64_t lane_row_bytes(const ModelProfile& m) {
  if (!m.moe()) return 0;
  if (m.lane_row_bytes > 0) return m.lane_row_bytes;
  const std::optional<kernels::WeightFormat> f = kernels::format_from_name(m.expert_format);
  return f ? engine::moe_lane_bytes(*f, m.hidden, m.moe_intermediate, 32, 1) : 0;
}

// Runtime scratch as Forward and MoeBlock allocate it (runtime/engine/forward.cpp, moe.cpp): activations for the
// rows of one step (the scheduler's step_rows: the prefill chunk plus one decode row per sequence), the MoE block's
// routing and expert buffers, and the gathered logits of a decode batch (allocated only when more than one
// sequence's last row is gathered).
uint64_t runtime_scratch_bytes(const ModelProfile& m, int64_t prefill_chunk, int64_t batch, int threads) {
  const int64_t chunk = prefill_chunk + batch;
  // The MoE block's prefill lanes: one per pool thread, each of up to kLaneRows rows (the measured row bytes leave
  // them out).
  const uint64_t lanes =
      uint64_t(std::max(threads, 1)) * uint64_t(std::min(engine::kLaneRows, chunk)) * lane_row_bytes(m) +
      uint64_t(std::max(threads, 1) - 1) * m.scratch_thread_bytes;
  if (m.scratch_row_bytes > 0)  // measured on the model (measure_model_profile)
    return uint64_t(chunk) * m.scratch_row_bytes + m.scratch_fixed_bytes +
           (batch > 1 ? uint64_t(batch * m.vocab) * 4 : 0) + lanes;
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  int64_t floats = chunk * (2 * m.hidden + q + 2 * kv + q) + (batch > 1 ? batch * m.vocab : 0);
  if (m.moe()) {
    const int64_t ffn = std::max(m.moe_intermediate, m.shared_intermediate);
    floats += chunk * (m.experts + 2 * m.top_k + 2 * m.hidden + 3 * ffn) + m.experts;  // ids are int32: 4 bytes too
    if (lane_row_bytes(m) > 0) floats += chunk * m.top_k * m.hidden;  // the lanes' outputs (chunk x top_k rows)
  } else {
    floats += chunk * 3 * m.intermediate;
  }
  // The kernels' MatmulScratch: int8 activations of the widest weight input (a byte a value, 12 bytes a block of 32,
  // a row pointer set per row), as kernels::matmul_scratch_sizes gives for quantized weights, and where this CPU has
  // AMX their bf16 copy too (2 bytes a value).
  const int64_t widest = std::max({m.hidden, q, m.intermediate, m.moe_intermediate, m.shared_intermediate});
  const uint64_t bf16 = kernels::matmul_uses_amx() ? uint64_t(chunk) * uint64_t(widest) * 2 : 0;
  return uint64_t(floats) * 4 + uint64_t(chunk) * (uint64_t(widest) + uint64_t(widest) / 32 * 12 + 32) + bf16 + lanes;
}

// The scratch account's peak: loading stages matrices there before the runtime buffers exist.
uint64_t scratch_bytes(const ModelProfile& m, int64_t chunk, int64_t batch, int threads) {
  return std::max(runtime_scratch_bytes(m, chunk, batch, threads), m.load_scratch_bytes);
}

// Flops of one token's k experts in one MoE layer.
double expert_flops_per_token(const ModelProfile& m) {
  return 2.0 * double(m.top_k) * 3 * double(m.hidden) * double(m.moe_intermediate);
}

// The SGEMM probe at kGemmEfficiency, flops/s: what prefill's GEMMs get where no better measurement applies.
double sgemm_flops(const DeviceProfile& d, int threads) {
  const ComputeSample* c = sample_for_threads(d, threads);
  return std::max(c ? c->sgemm_gflops : 1.0, 0.1) * kGemmEfficiency * 1e9;
}

// Storage bytes/s for `experts` expert reads requested together: the reader's block size at the queue depth their
// blocks fill (at most the reader's depth).
double expert_read_bw(const DeviceProfile& d, const ModelProfile& m, const Plan& p, double experts) {
  const double blocks =
      experts * std::ceil(double(m.expert_read_bytes) / double(std::max<uint64_t>(p.reader_block_size, 1)));
  const unsigned depth = unsigned(std::clamp(blocks, 1.0, double(std::max(p.reader_queue_depth, 1u))));
  return storage_gbs(d, p.reader_block_size, depth) * 1e9;
}

// The probes' key for a weight format: mlx_q8 runs the mlx_q4 kernel (one affine kernel for both).
std::string probe_key(const std::string& format) { return format == "mlx_q8" ? "mlx_q4" : format; }

// A rate probed at activation-row counts `at` (ascending, rates > 0) at `rows`: interpolated in log(rows) between
// the neighbouring counts, flat outside them. GFLOP/s in, GFLOP/s out.
double rate_at_rows(const std::vector<double>& at, const std::vector<double>& gflops, double rows) {
  if (rows <= at.front()) return gflops.front();
  for (size_t i = 1; i < at.size(); ++i)
    if (rows <= at[i]) {
      const double t = std::log(rows / at[i - 1]) / std::log(at[i] / at[i - 1]);
      return std::exp(std::log(gflops[i - 1]) * (1 - t) + std::log(gflops[i]) * t);
    }
  return gflops.back();
}

// Prefill's GEMM rate for a weight format at `rows` activation rows, flops/s: the engine's matmul as calibrate
// probed it at 16 and 128 rows (ComputeSample::matmul16_gflops, matmul_gflops), interpolated in log(rows) between
// them and flat outside; a profile without that probe, or a format it lacks, takes the SGEMM probe at
// kGemmEfficiency.
double gemm_flops(const DeviceProfile& d, int threads, const std::string& format, double rows) {
  const ComputeSample* c = sample_for_threads(d, threads);
  if (c) {
    const std::string key = probe_key(format);
    const auto many = c->matmul_gflops.find(key), few = c->matmul16_gflops.find(key);
    if (many != c->matmul_gflops.end() && many->second > 0) {
      if (few == c->matmul16_gflops.end() || few->second <= 0) return many->second * 1e9;
      return rate_at_rows({16, 128}, {few->second, many->second}, rows) * 1e9;
    }
  }
  return sgemm_flops(d, threads);
}

// One of the model's dense shapes at `rows`, flops/s: its own probe at the plan's threads (ModelProfile::
// prefill.gemms: the shape's kind and input width in the model's format), else the device's square-weight probe for
// the format (gemm_flops). On the 2-core VM the model's 2048-wide projections ran below the 4096 x 4096 probe's rate;
// on the device's idle 16-core Xeon about at it (bench/results/fit-accuracy.md).
double shape_gemm_flops(const DeviceProfile& d, const ModelProfile& m, int threads, const GemmShape& s, double rows) {
  for (const PrefillGemm& g : m.prefill.gemms) {
    if (g.threads != threads || g.kind != s.kind || g.in != s.in || g.format != m.weight_format) continue;
    const std::vector<double> at(g.rows.begin(), g.rows.end());
    if (std::all_of(g.gflops.begin(), g.gflops.end(), [](double r) { return r > 0; }))
      return rate_at_rows(at, g.gflops, rows) * 1e9;
  }
  return gemm_flops(d, threads, m.weight_format, rows);
}

// The per-row work between prefill's GEMMs over `rows` rows (ModelProfile::prefill's seconds per element; 0 where
// not probed): per layer and row four passes over the hidden state (two norms, two residual adds) and, in a dense
// MLP, the gate over the intermediate, spread over the pool's threads (Forward::per_row); in an MoE layer, per row
// and routed expert, the gather and weighted scatter-add of the row on the calling thread alone
// (MoeBlock::run_expert), and the gate over the expert's intermediate: on the pool where an expert's rows x
// intermediate reach engine::kParallelGateElements, else on the calling thread too.
double row_work_seconds(const ModelProfile& m, int threads, double rows) {
  const PrefillRates& r = m.prefill;
  if (r.gate_seconds <= 0) return 0;
  const double H = double(m.hidden), moe_layers = double(m.moe() ? m.moe_layers : 0);
  const double dense_layers = double(m.layers) - moe_layers;
  double parallel = rows * (double(m.layers) * 4 * H * r.row_seconds +
                            dense_layers * double(m.intermediate) * r.gate_seconds);
  double serial = rows * moe_layers * double(m.top_k) * 2 * H * r.row_seconds;
  const double moe_gate = rows * moe_layers * double(m.top_k) * double(m.moe_intermediate) * r.gate_seconds;
  // The rows an expert gets: the chunk's rows x top_k spread over the experts they touch.
  const double assignments = rows * double(m.top_k);
  const double per_expert = assignments / std::max(1.0, std::min(double(std::max<int64_t>(m.experts, 1)), assignments));
  if (rows > 1 && lane_row_bytes(m) > 0) {
    // On the engine's lanes the experts' gate and the adding of their outputs are timed with their GEMMs (the
    // expert probe runs them as the lanes do), not here.
    serial = 0;
  } else {
    (per_expert * double(m.moe_intermediate) >= double(engine::kParallelGateElements) ? parallel : serial) += moe_gate;
  }
  return parallel / double(std::max(threads, 1)) + serial;
}

// Seconds of every layer's dense matrices over `rows` activation rows, each shape at its own rate.
double dense_gemm_seconds(const DeviceProfile& d, const ModelProfile& m, int threads, double rows) {
  double seconds = 0;
  for (const GemmShape& s : m.dense_gemm_shapes())
    seconds += 2.0 * rows * double(s.out) * double(s.in) / shape_gemm_flops(d, m, threads, s, rows);
  return seconds * double(m.layers);
}

// MoE prefill's expert GEMMs, flops/s: the expert probe's rate for the format (ComputeSample::expert_gemm_gflops:
// a layer's experts of 16 rows each in pieces on the engine's lanes, with their gather, gate and the adding of their
// outputs); 0 where the profile lacks it.
double expert_gemm_flops(const DeviceProfile& d, int threads, const std::string& format) {
  const ComputeSample* c = sample_for_threads(d, threads);
  if (!c) return 0;
  const auto it = c->expert_gemm_gflops.find(probe_key(format));
  return it != c->expert_gemm_gflops.end() && it->second > 0 ? it->second * 1e9 : 0;
}

struct ExpertKey {
  int64_t layer;
  int32_t expert;
  double frequency;
};

// Every (layer, expert) by frequency, hottest first; ties spread across layers (expert id, then layer).
std::vector<ExpertKey> ranked_experts(const ModelProfile& m) {
  std::vector<ExpertKey> keys;
  for (int64_t l = 0; l < int64_t(m.expert_frequency.size()); ++l)
    for (int32_t e = 0; e < int32_t(m.expert_frequency[size_t(l)].size()); ++e)
      keys.push_back({l, e, m.expert_frequency[size_t(l)][size_t(e)]});
  std::stable_sort(keys.begin(), keys.end(), [](const ExpertKey& a, const ExpertKey& b) {
    if (a.frequency != b.frequency) return a.frequency > b.frequency;
    if (a.expert != b.expert) return a.expert < b.expert;
    return a.layer < b.layer;
  });
  return keys;
}

std::vector<std::vector<int32_t>> resident_set(const ModelProfile& m, const std::vector<ExpertKey>& ranked,
                                               int64_t count) {
  std::vector<std::vector<int32_t>> r(size_t(m.moe_layers));
  for (int64_t i = 0; i < std::min<int64_t>(count, int64_t(ranked.size())); ++i)
    r[size_t(ranked[size_t(i)].layer)].push_back(ranked[size_t(i)].expert);
  for (auto& layer : r) std::sort(layer.begin(), layer.end());
  return r;
}

struct StepCost {
  Prediction prediction;
  double step = 0;
};

}  // namespace

uint64_t Prediction::total_memory() const {
  uint64_t t = 0;
  for (auto& [_, b] : memory) t += b;
  return t;
}

int64_t Plan::gpu_resident_count() const {
  int64_t n = 0;
  for (auto& l : gpu_resident_experts) n += int64_t(l.size());
  return n;
}

int64_t Plan::resident_count() const {
  int64_t n = 0;
  for (auto& l : resident_experts) n += int64_t(l.size());
  return n;
}

// A layer's page layout in the codec: its own head size (Gemma 4's full-attention layers differ from the others).
// MLA layers keep their latent rows in f32: another codec is refused (invalid_argument: the codec search skips it).
static kv::CodecLayout layer_layout(const ModelProfile& m, kv::Codec codec, int64_t layer) {
  if (m.state_spec(layer).latent()) {
    if (codec != kv::Codec::f32)
      throw std::invalid_argument(fmt::format("KV codec '{}' is not supported on MLA layers (their latent rows are "
                                              "kept in f32)", kv::codec_name(codec)));
    return kv::CodecLayout{};  // f32 rows, no pages
  }
  const int64_t hd = m.state_spec(layer).head_dim;
  return kv::layout_for(codec, int(hd > 0 ? hd : m.head_dim));
}

double kv_bytes_per_token(const ModelProfile& m, const std::string& codec) {
  // One more position of every full-attention layer in the codec's page layout (windowed layers do not grow).
  const kv::Codec c = kv::parse_codec(codec);
  double total = 0;
  for (int64_t l = 0; l < m.layers; ++l) total += m.state_spec(l).bytes_per_token(layer_layout(m, c, l));
  return total;
}

uint64_t kv_sequence_bytes(const ModelProfile& m, const std::string& codec, int64_t context, int64_t chunk) {
  const kv::Codec c = kv::parse_codec(codec);
  uint64_t total = 0;
  for (int64_t l = 0; l < m.layers; ++l) total += m.state_spec(l).bytes(layer_layout(m, c, l), context, chunk);
  return total;
}

uint64_t kv_cache_bytes(const ModelProfile& m, const std::string& codec, int64_t context, int64_t batch,
                        int64_t chunk) {
  // Every sequence's pages for the whole context, allocated up front (runtime/engine/kv_cache.h).
  return uint64_t(std::max<int64_t>(batch, 0)) *
         kv_sequence_bytes(m, codec, int64_t(round_up(uint64_t(std::max<int64_t>(context, 0)), kv::kBlockTokens)),
                           chunk);
}

ReaderChoice choose_reader(const StorageInfo& storage, const ModelProfile& m) {
  ReaderChoice best;
  if (storage.sweep.empty()) return best;
  const std::vector<uint64_t> extents = m.read_extents();
  const uint64_t longest = *std::max_element(extents.begin(), extents.end());
  uint64_t bytes = 0;
  for (uint64_t e : extents) bytes += e;
  // A block larger than the smallest probed one covering the longest read issues the same requests, each shorter
  // than the probe's: its measured rate does not apply.
  uint64_t covering = 0;
  unsigned deepest = 0;
  for (auto& s : storage.sweep) {
    if (s.block_size >= longest && (covering == 0 || s.block_size < covering)) covering = s.block_size;
    deepest = std::max(deepest, s.queue_depth);
  }
  const int64_t k = std::max<int64_t>(m.top_k, 1);
  struct Candidate {
    const StorageSample* sample;
    int64_t requests;  // one expert's
    int64_t waves;     // submissions one layer's top_k misses need at the cell's depth
    double seconds;
  };
  std::vector<Candidate> candidates;
  for (auto& s : storage.sweep) {
    if (s.gbs <= 0 || s.block_size == 0 || s.queue_depth == 0 || (s.block_size > longest && s.block_size != covering))
      continue;
    int64_t requests = 0;
    for (uint64_t e : extents) requests += int64_t((e + s.block_size - 1) / s.block_size);
    const int64_t layer_requests = k * requests;
    const int64_t waves = (layer_requests + s.queue_depth - 1) / s.queue_depth;
    // Reads beyond the queue depth start only when the forward thread next polls the reader (ExpertReader::pump),
    // i.e. after the compute they were meant to overlap: one submission (waves == 1) is what the cost assumes.
    if (waves > 1 && s.queue_depth != deepest) continue;
    const double gbs = storage_gbs(storage, s.block_size, s.queue_depth);  // the cell's isotonic rate
    const double seconds = double(k * int64_t(bytes)) / (gbs * 1e9) + double(layer_requests) * s.cpu_seconds_per_read;
    candidates.push_back({&s, requests, waves, seconds});
  }
  if (candidates.empty()) return best;
  int64_t fewest_waves = candidates.front().waves;
  for (auto& c : candidates) fewest_waves = std::min(fewest_waves, c.waves);
  double fastest = 1e300;
  for (auto& c : candidates)
    if (c.waves == fewest_waves) fastest = std::min(fastest, c.seconds);
  const Candidate* chosen = nullptr;
  for (auto& c : candidates)
    if (c.waves == fewest_waves && c.seconds <= fastest * 1.05 &&
        (!chosen || c.requests < chosen->requests || (c.requests == chosen->requests && c.seconds < chosen->seconds)))
      chosen = &c;
  best.block_size = chosen->sample->block_size;
  best.queue_depth = std::max(chosen->sample->queue_depth, unsigned(std::min<int64_t>(k, 64)));
  best.gbs = storage_gbs(storage, chosen->sample->block_size, chosen->sample->queue_depth);
  best.requests_per_expert = chosen->requests;
  best.seconds = chosen->seconds;
  best.submissions = chosen->waves;
  return best;
}

double estimate_hit_rate(const ModelProfile& m, const std::vector<std::vector<int32_t>>& resident, int64_t slots,
                         const RouterTrace* trace) {
  if (!m.moe()) return 1.0;
  std::vector<std::vector<bool>> is_resident(size_t(m.moe_layers), std::vector<bool>(size_t(m.experts), false));
  for (size_t l = 0; l < resident.size() && l < is_resident.size(); ++l)
    for (int32_t e : resident[l]) is_resident[l][size_t(e)] = true;
  if (trace && trace->tokens() > 0) {
    // Replay: resident set first, then true LRU over `slots` keys, as ExpertCache does without prefetch.
    std::list<int64_t> lru;
    std::unordered_map<int64_t, std::list<int64_t>::iterator> where;
    uint64_t hits = 0, total = 0;
    const int64_t k = trace->top_k;
    const int64_t layers = std::min<int64_t>(trace->layers, m.moe_layers);  // (the GPU's: its first layers)
    for (int64_t t = 0; t < trace->tokens(); ++t)
      for (int64_t l = 0; l < layers; ++l)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = trace->selections[size_t((t * trace->layers + l) * k + j)];
          const bool counted = t >= trace->held_out_from;  // earlier tokens only warm the slots
          total += counted;
          if (is_resident[size_t(l)][size_t(e)]) {
            hits += counted;
            continue;
          }
          const int64_t key = l * m.experts + e;
          auto it = where.find(key);
          if (it != where.end()) {
            hits += counted;
            lru.splice(lru.begin(), lru, it->second);
            continue;
          }
          if (slots <= 0) continue;
          if (int64_t(lru.size()) >= slots) {
            where.erase(lru.back());
            lru.pop_back();
          }
          lru.push_front(key);
          where[key] = lru.begin();
        }
    return total ? double(hits) / double(total) : 1.0;
  }
  // Characteristic-time approximation of LRU under independent requests: find T with
  // sum_i (1 - exp(-rate_i T)) = slots over the non-resident experts; expert i then hits with 1 - exp(-rate_i T).
  std::vector<double> rates;
  double resident_mass = 0, total_mass = 0;
  for (int64_t l = 0; l < m.moe_layers; ++l)
    for (int64_t e = 0; e < m.experts; ++e) {
      const double f = m.expert_frequency[size_t(l)][size_t(e)];
      total_mass += f;
      if (is_resident[size_t(l)][size_t(e)]) resident_mass += f;
      else if (f > 0) rates.push_back(f);
    }
  if (total_mass <= 0) return 1.0;
  if (int64_t(rates.size()) <= slots) return 1.0;
  auto occupied = [&](double T) {
    double s = 0;
    for (double r : rates) s += 1.0 - std::exp(-r * T);
    return s;
  };
  double lo = 0, hi = 1;
  while (occupied(hi) < double(slots) && hi < 1e12) hi *= 2;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (occupied(mid) < double(slots) ? lo : hi) = mid;
  }
  double slot_mass = 0;
  for (double r : rates) slot_mass += r * (1.0 - std::exp(-r * lo));
  return (resident_mass + slot_mass) / total_mass;
}

namespace {

// Per-step costs of decode at a thread count: measured on the model (ModelTiming, scaled by the matvec rate when
// the plan's thread count was not timed) or, without timings, the analytic fallback.
struct DecodeCosts {
  bool measured = false;
  double base = 0;        // a step without its experts and without routing: dense weights, norms, attention, dispatch
  double expert = 0;      // one expert on one row
  double router = 0;      // one router + top-k
  double miss = 0, miss_batch = 0;  // one expert read + converted alone / per expert, top_k together
  int timed_threads = 0;
};

DecodeCosts decode_costs(const DeviceProfile& d, const ModelProfile& m, int threads) {
  DecodeCosts c;
  const ModelTiming* best = nullptr;
  for (auto& t : m.timings)
    if (t.step_seconds > 0 && (!best || std::abs(t.threads - threads) < std::abs(best->threads - threads))) best = &t;
  if (!best) return c;
  // Bandwidth-bound: another thread count scales by the matvec rate the device probe measured.
  const std::string& fmt = m.moe() ? m.expert_format : m.weight_format;
  const double scale = best->threads == threads ? 1.0 : matvec_gbs(d, best->threads, fmt) / matvec_gbs(d, threads, fmt);
  c.measured = true;
  c.timed_threads = best->threads;
  c.expert = best->expert_seconds * scale;
  c.router = best->router_seconds * scale;
  c.base = std::max(0.0, best->step_seconds - double(m.moe_layers * m.top_k) * best->expert_seconds) * scale;
  c.miss = best->miss_seconds;
  c.miss_batch = best->miss_batch_seconds > 0 ? best->miss_batch_seconds : best->miss_seconds;
  return c;
}

// One GPU-layer expert run on the CPU in a decode step (hybrid placement): the measured per-expert cost, else its
// payload at the experts' matvec rate plus the per-expert overhead.
double cpu_expert_seconds(const DeviceProfile& d, const ModelProfile& m, const DecodeCosts& costs, int threads) {
  return costs.measured ? costs.expert
                        : double(m.expert_payload_bytes) / (matvec_gbs(d, threads, m.expert_format) * 1e9) +
                              kExpertOverheadSeconds;
}

// Copying one expert that is not in VRAM into a VRAM slot: staging memcpy, then PCIe, at the slower rate.
double expert_copy_seconds(const DeviceProfile& d, const ModelProfile& m) {
  return double(m.expert_bytes) / (std::min(std::max(d.gpu.h2d_gbs, 0.1), kStagingCopyGbs) * 1e9);
}

// Hybrid MoE placement: the largest step, in rows, whose GPU-layer experts that are not in VRAM are predicted to
// run faster on the CPU (each from the host cache: its matvec, or its GEMM share of the step's rows) than copied
// into VRAM slots (the GPU's compute on them is taken as free); 0 when a copy wins even for one row. Steps of R rows
// touch D(R) distinct experts (uniform routing: E (1 - (1 - k/E)^R)).
int64_t hybrid_cpu_expert_rows(const DeviceProfile& d, const ModelProfile& m, const DecodeCosts& costs, int threads,
                               int64_t max_rows) {
  if (!m.moe() || m.experts <= 0 || d.gpu.h2d_gbs <= 0) return 0;
  const double per_expert = cpu_expert_seconds(d, m, costs, threads);
  double gemm = expert_gemm_flops(d, threads, m.expert_format);
  if (gemm <= 0) gemm = sgemm_flops(d, threads);
  const double copy = expert_copy_seconds(d, m);
  const double share = std::min(1.0, double(m.top_k) / double(m.experts));
  int64_t rows = 0;
  for (int64_t r = 1; r <= max_rows; ++r) {
    const double distinct = double(m.experts) * (1.0 - std::pow(1.0 - share, double(r)));
    const double cpu = distinct * per_expert + (r > 1 ? double(r) * expert_flops_per_token(m) / gemm : 0.0);
    if (cpu > distinct * copy) break;
    rows = r;
  }
  return rows;
}

// Bytes one GPU layer holds besides experts (attention, norms, router, shared expert), and the output head.
uint64_t gpu_layer_bytes(const ModelProfile& m) {
  uint64_t b = 0;
  for (auto& c : m.classes)
    if (c.name != "experts" && c.name != "embedding" && c.name != "output") b += c.bytes;
  return m.layers ? b / uint64_t(m.layers) : 0;
}
uint64_t gpu_head_bytes(const ModelProfile& m) {
  for (auto& c : m.classes)
    if (c.name == "output") return c.bytes;
  for (auto& c : m.classes)
    if (c.name == "embedding") return c.bytes;
  return 0;
}
// Device KV bytes of GPU layers [0, g) for `batch` sequences of `context` tokens, as GpuLayers allocates it: pages
// of GpuLayers::kv_page_positions() positions of f16 K and V, or q8 (1 byte + an f32 scale per 32), every position
// on a full-attention layer, a ring bounded to the window on a sliding-window one (GpuLayers::kv_layer_pages, for
// steps of prefill_chunk + batch rows: Scheduler::step_rows); a Gated DeltaNet layer holds no pages but a slot of
// f32 conv + recurrent state per sequence (GpuLayers' recurrent states, whatever the KV codec).
double gpu_kv_value_bytes(const std::string& codec) { return codec == "q8" ? 1.0 + 4.0 / 32 : 2.0; }
uint64_t gpu_kv_bytes(const ModelProfile& m, const Plan& p, const std::string& codec, int64_t g, int64_t batch) {
  const double per_value = gpu_kv_value_bytes(codec);
  const int64_t page = gpu::GpuLayers::kv_page_positions(), chunk = p.prefill_chunk + p.batch;
  double positions = 0;  // per sequence, times the layer's kv_heads * head_dim
  uint64_t states = 0;   // per sequence
  for (int64_t l = 0; l < std::min(g, m.layers); ++l) {
    const kv::StateSpec s = m.state_spec(l);
    if (s.recurrent()) {
      states += s.recurrent_bytes;
      continue;
    }
    positions += double(gpu::GpuLayers::kv_layer_pages(s.window, p.context, chunk) * page) *
                 double(s.kv_heads * s.head_dim);
  }
  return uint64_t(double(batch) * positions * 2 * per_value) + uint64_t(batch) * states;
}
// Device KV bytes attention reads per decoded token of one sequence on GPU layers [0, g), averaged over the
// context: half of it on a full-attention layer, at most the window on a sliding-window one; a Gated DeltaNet
// layer's state read and written once.
double gpu_kv_read_bytes(const ModelProfile& m, const Plan& p, int64_t g) {
  double bytes = 0;
  for (int64_t l = 0; l < std::min(g, m.layers); ++l) {
    const kv::StateSpec s = m.state_spec(l);
    if (s.recurrent()) {
      bytes += 2 * double(s.recurrent_bytes);
      continue;
    }
    const double seen = s.windowed() ? std::min(double(s.window), double(p.context) / 2) : double(p.context) / 2;
    bytes += seen * double(s.kv_heads * s.head_dim) * 2 * gpu_kv_value_bytes(p.gpu_kv_codec);
  }
  return bytes;
}

// Attention flops of `rows` queries at positions [start, start + rows): QK^T and PV over the positions each query
// sees (a windowed layer at most its window; recurrent layers none), 2 flops per multiply-add.
double attention_flops(const ModelProfile& m, int64_t start, int64_t rows) {
  double flops = 0;
  const double per_position = 4.0 * double(m.heads * m.head_dim);
  for (int64_t l = 0; l < m.layers; ++l) {
    if (m.state_spec(l).recurrent()) continue;  // a recurrent (DeltaNet) layer's cost is its projections
    const int64_t window = m.state_spec(l).window;
    for (int64_t r = 0; r < rows; r += std::max<int64_t>(rows / 8, 1)) {  // 8 samples of the chunk suffice
      const int64_t seen = start + r + 1;
      flops += per_position * double(window > 0 ? std::min(seen, window) : seen) *
               double(std::min<int64_t>(std::max<int64_t>(rows / 8, 1), rows - r));
    }
  }
  return flops;
}

// Prefill attention of `rows` rows from position `start`: at the rate probe_prefill measured for the plan's threads
// and KV codec (seconds per query head and position seen), else as f32 GEMM flops.
static double attention_seconds(const DeviceProfile& d, const ModelProfile& m, const Plan& p, int64_t start,
                                int64_t rows) {
  const PrefillRates& r = m.prefill;
  const double flops = attention_flops(m, start, rows);
  if (r.attention_seconds > 0 && r.attention_threads == p.threads && r.attention_codec == p.kv_codec && m.head_dim > 0)
    return flops / (4.0 * double(m.head_dim)) * r.attention_seconds;  // attention_flops: 4 x head_dim a head-position
  return flops / gemm_flops(d, p.threads, "f32", double(rows));
}

// The cost model: seconds per decode step by term, tokens/s, memory by account.
StepCost evaluate(const DeviceProfile& d, const ModelProfile& m, const Plan& p, const RouterTrace* trace) {
  StepCost c;
  Prediction& pr = c.prediction;
  const double dense_bw = matvec_gbs(d, p.threads, m.weight_format) * 1e9;
  const double expert_bw = matvec_gbs(d, p.threads, m.expert_format) * 1e9;
  const double read_bw = std::max(d.read_gbs(), 0.1) * 1e9;
  const DecodeCosts costs = decode_costs(d, m, p.threads);
  const int64_t B = p.batch;
  const int64_t L = std::max<int64_t>(m.layers, 1);
  const int64_t g = std::clamp<int64_t>(p.gpu_layers, 0, L);
  const double cpu_share = double(L - g) / double(L);  // layers left on the CPU
  const uint64_t head = gpu_head_bytes(m);
  auto& t = pr.step_seconds;
  // Dense weights a step streams on the CPU: the layers left there, and the head unless the GPU runs it.
  const double head_read = g == L ? 0.0 : double(head);
  const double layer_read = std::max(0.0, double(m.dense_read_per_token()) - double(head));
  const double dense_analytic = (layer_read * cpu_share + head_read) / dense_bw;
  if (costs.measured) {
    t["dense"] = std::min(dense_analytic, costs.base * cpu_share);
    t["overhead"] = costs.base * cpu_share - t["dense"];
  } else {
    t["dense"] = dense_analytic;
    t["overhead"] = double(L - g) * kLayerOverheadSeconds;
  }
  // A decode step reads each sequence's KV at its average position (a windowed layer at most its window).
  t["kv"] = double(B) * double(kv_sequence_bytes(m, p.kv_codec, std::max<int64_t>(p.context / 2, 1), 1)) / read_bw *
            cpu_share;
  t["gpu"] = 0;
  t["experts"] = 0;
  t["misses"] = 0;
  pr.gpu_expert_hit_rate = 1;
  if (m.moe()) {
    const bool hybrid = g > 0 && p.gpu_cpu_expert_rows >= B;  // GPU layers' experts outside VRAM run on the CPU
    pr.expert_hit_rate = estimate_hit_rate(m, p.resident_experts, p.cache_slots, trace);
    std::vector<double> distinct_per_layer;
    double distinct = 0, distinct_cpu = 0, distinct_gpu = 0;
    for (size_t l = 0; l < m.expert_frequency.size(); ++l) {
      const double dl = distinct_experts(m.expert_frequency[l], B);
      distinct += dl;
      (int64_t(l) < g ? distinct_gpu : distinct_cpu) += dl;
    }
    // GPU layers: experts found in VRAM never touch the host tier.
    if (g > 0) {
      ModelProfile gm = m;
      gm.moe_layers = std::min<int64_t>(g, m.moe_layers);
      gm.expert_frequency.resize(size_t(gm.moe_layers));
      // Replayed on the trace's held-out half where there is one (as the host cache's): frequencies from a short
      // trace leave most experts at zero, and a resident set holding every one seen looked like a 100% hit rate
      // (the device's 24-layer Qwen3-30B-A3B cut: predicted 100%, ~80% measured). A hybrid decode step uses no
      // VRAM slots (the CPU runs what is not resident).
      pr.gpu_expert_hit_rate = estimate_hit_rate(gm, p.gpu_resident_experts, hybrid ? 0 : p.gpu_expert_slots, trace);
    }
    const double host_requests = distinct_cpu + distinct_gpu * (1.0 - pr.gpu_expert_hit_rate);
    const double misses = host_requests * (1.0 - pr.expert_hit_rate);
    pr.miss_bytes_per_token = misses * double(m.expert_read_bytes) / double(B);
    const double per_layer = std::max(1.0, misses / double(m.moe_layers));
    const double storage_bw = expert_read_bw(d, m, p, per_layer);
    if (costs.measured) {
      t["experts"] = distinct_cpu * costs.expert;
      // Routing: the router, and for single-sequence decode with prefetch the next layer's router once more.
      const double routers = (B == 1 && p.prefetch_limit > 0) ? 2.0 : 1.0;
      t["overhead"] += double(L - g) * costs.router * routers;
      // A miss alone pays its whole read and conversion; misses of one layer requested together overlap their
      // reads: interpolate between the two measurements by misses per layer.
      const double together = std::clamp((per_layer - 1.0) / std::max<double>(double(m.top_k) - 1.0, 1.0), 0.0, 1.0);
      const double per_miss = costs.miss + (costs.miss_batch - costs.miss) * together;
      t["misses"] = misses * (per_miss > 0 ? per_miss : double(m.expert_read_bytes) / storage_bw);
    } else {
      t["experts"] = distinct_cpu * double(m.expert_payload_bytes) / expert_bw;
      t["misses"] = misses * double(m.expert_read_bytes) / storage_bw;
      if (!m.packed_experts) t["misses"] += misses * double(m.expert_bytes) / read_bw;  // conversion into the slot
      // Each expert pays its launches, except that a single row's resident experts run together (MoeBlock's
      // run_resident_row_experts: two launches for all of them, in a format kernels::matvec_batch takes): a layer's
      // expected resident picks (its frequencies over the resident set) cost one expert's overhead between them.
      const std::optional<kernels::WeightFormat> expert_format = kernels::format_from_name(m.expert_format);
      double experts_overhead = distinct_cpu;
      if (B == 1 && expert_format && kernels::matvec_batch_supported(*expert_format))
        for (size_t l = size_t(g); l < m.expert_frequency.size() && l < p.resident_experts.size(); ++l) {
          double resident = 0;
          for (int32_t e : p.resident_experts[l]) resident += m.expert_frequency[l][size_t(e)];
          experts_overhead -= std::max(0.0, resident - 1.0);
        }
      t["overhead"] += experts_overhead * kExpertOverheadSeconds;
    }
    if (g > 0 && d.gpu.memory_gbs > 0) {
      const double outside = distinct_gpu * (1.0 - pr.gpu_expert_hit_rate);  // GPU layers' experts not in VRAM
      const double in_vram = double(m.expert_payload_bytes) / (d.gpu.memory_gbs * 1e9) + kGpuExpertOverheadSeconds;
      t["gpu"] += distinct_gpu * pr.gpu_expert_hit_rate * in_vram;
      if (hybrid) {
        // They run on the CPU, as a CPU layer's experts do (the shared expert overlaps them on the GPU).
        t["experts"] += outside * cpu_expert_seconds(d, m, costs, p.threads);
      } else {
        t["gpu"] += outside * (in_vram + expert_copy_seconds(d, m));  // copied into a slot, then run there
      }
    }
  }
  if (g > 0 && d.gpu.memory_gbs > 0) {
    const double gpu_bw = d.gpu.memory_gbs * 1e9;
    t["gpu"] += double(g) * (double(gpu_layer_bytes(m)) / gpu_bw + kGpuLayerOverheadSeconds) +
                double(B) * gpu_kv_read_bytes(m, p, g) / gpu_bw +
                (g == L ? double(head) / gpu_bw : 0.0) +
                2.0 * double(B * m.hidden * 4) / (std::max(d.gpu.h2d_gbs, 0.1) * 1e9);  // hidden state up and down
  }
  for (auto& [_, s] : t) c.step += s;
  pr.decode_tokens_per_second = double(B) / c.step;

  pr.prefill_tokens_per_second = predicted_prefill_rate(d, m, p);

  auto& mem = pr.memory;
  mem["weights"] = m.dense_bytes();
  mem["kv"] = kv_cache_bytes(m, p.kv_codec, p.context, B, p.prefill_chunk);
  mem["scratch"] = runtime_scratch_bytes(m, p.prefill_chunk, B, p.threads);
  pr.scratch_peak_bytes = scratch_bytes(m, p.prefill_chunk, B, p.threads);
  if (m.moe()) {
    mem["resident_experts"] = uint64_t(p.resident_count()) * m.expert_bytes;
    mem["expert_cache"] = uint64_t(p.cache_slots) * (m.expert_bytes + m.expert_staging_bytes);
    mem["expert_staging"] = m.expert_conversion_bytes;
  }
  if (g > 0) {
    auto& v = pr.vram;
    v["weights"] = uint64_t(g) * gpu_layer_bytes(m) + (g == L ? head : 0);
    v["kv"] = gpu_kv_bytes(m, p, p.gpu_kv_codec, g, B);
    v["scratch"] = kGpuScratchBytes;
    if (m.moe()) {
      v["resident_experts"] = uint64_t(p.gpu_resident_count()) * m.expert_bytes;
      v["expert_slots"] = uint64_t(p.gpu_expert_slots) * m.expert_bytes;
    }
  }
  return c;
}

uint64_t vram_total(const Prediction& pr) {
  uint64_t t = 0;
  for (auto& [_, b] : pr.vram) t += b;
  return t;
}

std::string mib(uint64_t b) { return fmt::format("{:.1f} MiB", double(b) / kMiB); }

}  // namespace

double predicted_prefill_rate(const DeviceProfile& d, const ModelProfile& m, const Plan& p) {
  return double(p.prefill_chunk) / prefill_seconds(d, m, p, p.prefill_chunk);
}

double prefill_seconds(const DeviceProfile& d, const ModelProfile& m, const Plan& p, int64_t tokens) {
  return prefill_cost(d, m, p, tokens).total();
}

PrefillCost prefill_cost(const DeviceProfile& d, const ModelProfile& m, const Plan& p, int64_t tokens) {
  // Chunks of the plan's prefill chunk. Per chunk of R rows: the layers' dense matrices at the engine's GEMM rate for
  // their format at R rows, or, for a few rows, the time to stream them at the matvec rate, whichever is longer;
  // attention over the positions each row sees (at the f32 rate); the output head for the chunk's last row only (the
  // engine computes no other row's logits). Per MoE layer: the experts the chunk touches computed (see expert_gemm
  // below), while the non-resident ones are read: the engine starts those reads first and computes the experts in memory
  // meanwhile, so a layer costs the longer of the two. Every touched non-resident expert is read (a chunk touching
  // more experts than the cache holds sweeps an LRU cache: no reuse assumed); reads at the reader's block size and
  // queue depth.
  PrefillCost cost;
  if (tokens <= 0) return cost;
  const std::string expert_format = m.moe() ? m.expert_format : m.weight_format;
  const double dense_bw = matvec_gbs(d, p.threads, m.weight_format) * 1e9;
  const double expert_bw = matvec_gbs(d, p.threads, expert_format) * 1e9;
  // The experts are many small GEMMs of a few rows each (a chunk's rows * k / touched), each paying its activation
  // pass, gather and scatter: below the probe's rate on one large matrix (q4 at 16 rows on a 2048 x 1024 expert,
  // each split over the pool: 155 GFLOP/s against 743 on 4096 x 4096 at 128 rows, a 2-core VM). They take the
  // expert probe's rate, which times the engine's lanes over distinct experts (their reads from RAM included). A
  // profile without it keeps the SGEMM probe at kGemmEfficiency plus one stream of each touched expert: what measured MoE prefill
  // matched on the 2-core VM (1.06-1.14 at load 0.7, bench/results/fit-accuracy.md) but 2.6x too slow on an idle
  // 16-core Xeon, where the SGEMM probe's small quick matrix does not scale with the cores.
  // The model's own experts probed at the plan's threads (probe_prefill) over the device's expert probe of
  // Qwen3-30B-A3B's shape: fit_accuracy_bench's 1024 x 1024 q4 experts ran their MoE blocks at 1.5 TFLOP/s on the
  // device's Xeon where the device probe's shape said 1.7-1.9.
  const PrefillRates& own = m.prefill;
  const double probed_expert_gemm = own.expert_gflops > 0 && own.expert_threads == p.threads &&
                                            own.expert_format == m.expert_format
                                        ? own.expert_gflops * 1e9
                                        : expert_gemm_flops(d, p.threads, expert_format);
  const bool expert_probe = probed_expert_gemm > 0;
  const double expert_gemm = expert_probe ? probed_expert_gemm : sgemm_flops(d, p.threads);
  const uint64_t head = gpu_head_bytes(m);
  const double layer_bytes = std::max(0.0, double(m.dense_read_per_token()) - double(head));
  const int64_t chunk = std::max<int64_t>(p.prefill_chunk, 1);
  for (int64_t start = 0; start < tokens; start += chunk) {
    const int64_t rows = std::min(chunk, tokens - start);
    cost.dense += std::max(dense_gemm_seconds(d, m, p.threads, double(rows)), layer_bytes / dense_bw);
    cost.attention += attention_seconds(d, m, p, start, rows);
    cost.head += double(head) / dense_bw;
    cost.rows += row_work_seconds(m, p.threads, double(rows));
    if (!m.moe()) continue;
    for (size_t l = 0; l < m.expert_frequency.size(); ++l) {
      std::vector<double> f = m.expert_frequency[l];
      const double touched = distinct_experts(f, rows);
      double compute = double(rows) * expert_flops_per_token(m) / expert_gemm;
      if (!expert_probe) compute += touched * double(m.expert_payload_bytes) / expert_bw;
      if (l < p.resident_experts.size())
        for (int32_t e : p.resident_experts[l]) f[size_t(e)] = 0;
      const double missing = distinct_experts(f, rows);
      const double reads = missing * double(m.expert_read_bytes) / expert_read_bw(d, m, p, missing);
      cost.experts += std::max(compute, reads);
    }
  }
  return cost;
}

// GPU layers and the VRAM expert set, on top of the host plan (the host keeps every weight: GpuLayers copies them).
// VRAM: free device memory minus kGpuReserveBytes. The first `g` layers need their dense weights, their device KV
// (f16, or q8 where that lets more layers fit), scratch, for MoE at least 4 x top_k expert slots, and the output
// head when g is every layer. For candidate g from 0 to the most that fit, the VRAM left goes to the hottest
// experts of the GPU layers (resident) and the slots; the fastest predicted step wins (ties: more layers).
static void plan_gpu(const DeviceProfile& d, const ModelProfile& m, Plan& p, const PlanRequest& request) {
  p.gpu_layers = 0;
  p.gpu_resident_experts.clear();
  p.gpu_expert_slots = 0;
  p.gpu_budget_bytes = 0;
  if (request.gpu_layers && *request.gpu_layers == 0) {
    p.gpu_reason = "given: no GPU layers";
    p.rationale.push_back({"gpu_layers", "0", p.gpu_reason, {}});
    return;
  }
  if (!d.gpu.present || d.gpu.memory == 0) {
    p.gpu_reason = d.gpu.reason.empty() ? "no GPU" : d.gpu.reason;
    p.rationale.push_back({"gpu_layers", "0", p.gpu_reason, {{"gpu_memory", double(d.gpu.memory)}}});
    return;
  }
  const uint64_t free_bytes = d.gpu.free_memory ? d.gpu.free_memory : d.gpu.memory;
  uint64_t budget = free_bytes > kGpuReserveBytes ? free_bytes - kGpuReserveBytes : 0;
  if (request.gpu_budget_bytes > 0) budget = std::min(budget, request.gpu_budget_bytes);  // calibrate --gpu-memory
  const int64_t L = m.layers;
  const uint64_t layer = gpu_layer_bytes(m), head = gpu_head_bytes(m);
  const int64_t min_slots = m.moe() ? 4 * m.top_k : 0;
  auto fixed = [&](int64_t g, const std::string& codec) {
    return uint64_t(g) * layer + gpu_kv_bytes(m, p, codec, g, p.batch) + (g == L ? head : 0) +
           kGpuScratchBytes + uint64_t(min_slots) * m.expert_bytes;
  };
  auto most_layers = [&](const std::string& codec) {
    int64_t g = 0;
    while (g < L && fixed(g + 1, codec) <= budget) ++g;
    return g;
  };
  std::string codec = "f16";
  int64_t g_max = most_layers("f16");
  if (g_max < L && most_layers("q8") > g_max) {
    codec = "q8";
    g_max = most_layers("q8");
  }
  std::map<std::string, double> ms{{"gpu_memory", double(d.gpu.memory)},
                                   {"gpu_free", double(free_bytes)},
                                   {"gpu_budget", double(budget)},
                                   {"gpu_memory_gbs", d.gpu.memory_gbs},
                                   {"h2d_gbs", d.gpu.h2d_gbs},
                                   {"layer_bytes", double(layer)},
                                   {"kv_layer_bytes", double(gpu_kv_bytes(m, p, codec, L, p.batch)) / double(L)}};
  if (request.gpu_layers) g_max = std::min<int64_t>(g_max, *request.gpu_layers);
  if (g_max == 0) {
    p.gpu_reason = fmt::format("{} ({}) has {} for the plan; one layer needs {}", d.gpu.name, mib(d.gpu.memory),
                               mib(budget), mib(fixed(1, codec)));
    p.rationale.push_back({"gpu_layers", "0", p.gpu_reason, ms});
    return;
  }
  p.gpu_budget_bytes = budget;
  p.gpu_kv_codec = codec;
  std::vector<ExpertKey> ranked;
  if (m.moe()) ranked = ranked_experts(m);
  if (m.moe())
    p.gpu_cpu_expert_rows = hybrid_cpu_expert_rows(d, m, decode_costs(d, m, p.threads), p.threads, p.prefill_chunk);
  ms["cpu_expert_rows"] = double(p.gpu_cpu_expert_rows);
  Plan best = p;
  double best_step = evaluate(d, m, p, request.trace).step;
  const double cpu_step = best_step;
  std::vector<int64_t> candidates;
  for (int i = 1; i <= 8; ++i) candidates.push_back(std::max<int64_t>(1, g_max * i / 8));
  for (int64_t g : candidates) {
    Plan c = p;
    c.gpu_layers = int(g);
    if (m.moe()) {
      const uint64_t left = budget - fixed(g, codec);
      std::vector<ExpertKey> mine;
      for (auto& k : ranked)
        if (k.layer < g) mine.push_back(k);
      const int64_t resident = std::min<int64_t>(int64_t(left / m.expert_bytes), int64_t(mine.size()));
      c.gpu_resident_experts.assign(size_t(g), {});
      for (int64_t i = 0; i < resident; ++i) c.gpu_resident_experts[size_t(mine[size_t(i)].layer)].push_back(mine[size_t(i)].expert);
      for (auto& l : c.gpu_resident_experts) std::sort(l.begin(), l.end());
      c.gpu_expert_slots = min_slots;
    }
    const double step = evaluate(d, m, c, request.trace).step;
    if (step < best_step * 0.999 || (step <= best_step * 1.001 && g > best.gpu_layers)) {
      best_step = std::min(best_step, step);
      best = c;
    }
  }
  p.gpu_layers = best.gpu_layers;
  p.gpu_resident_experts = best.gpu_resident_experts;
  p.gpu_expert_slots = best.gpu_expert_slots;
  if (p.gpu_layers == 0) {
    p.gpu_budget_bytes = 0;
    p.gpu_cpu_expert_rows = 0;
    p.gpu_reason = fmt::format("{}: no GPU split predicted faster than the CPU alone", d.gpu.name);
  } else {
    p.gpu_reason = fmt::format("{}: {} of {} layers fit {} of VRAM (KV {}){}", d.gpu.name, p.gpu_layers, L,
                               mib(budget), codec,
                               m.moe() ? fmt::format(", {} experts resident in VRAM, the others {}",
                                                     p.gpu_resident_count(),
                                                     p.gpu_cpu_expert_rows > 0
                                                         ? fmt::format("on the CPU in steps of up to {} rows",
                                                                       p.gpu_cpu_expert_rows)
                                                         : std::string("copied into VRAM slots"))
                                       : "");
  }
  ms["cpu_only_step_seconds"] = cpu_step;
  ms["chosen_step_seconds"] = best_step;
  ms["max_layers"] = double(g_max);
  p.rationale.push_back({"gpu_layers", std::to_string(p.gpu_layers), p.gpu_reason, ms});
}

namespace {

Plan plan_for_batch(const DeviceProfile& d, const ModelProfile& m, const PlanRequest& request) {
  if (request.context < 1 || request.batch < 1) throw PlanError("plan: context and batch must be positive");
  if (m.moe() && int64_t(m.expert_frequency.size()) != m.moe_layers)
    throw PlanError("plan: the model profile has no expert frequencies for every MoE layer");
  Plan p;
  p.device_fingerprint = d.fingerprint();
  p.model_fingerprint = m.fingerprint;
  p.context = request.context;
  p.batch = request.batch;
  const uint64_t usable = d.memory.usable();
  p.budget_bytes = request.budget_bytes ? request.budget_bytes : uint64_t(double(usable) * kDefaultBudgetFraction);
  p.rationale.push_back({"budget", mib(p.budget_bytes),
                         request.budget_bytes ? "given" : fmt::format("{:.0f}% of usable memory", kDefaultBudgetFraction * 100),
                         {{"mem_total", double(d.memory.total)}, {"mem_available", double(d.memory.available)},
                          {"limit", double(d.memory.limit())}, {"usable", double(usable)}}});

  // Threads: where calibrate timed this model's decode step at several thread counts, the fewest within 3% of the
  // fastest step (the model's own measurement: a format without a matvec probe of its own, MXFP4 for one, can
  // scale differently from the probed ones); otherwise the fewest that reach 97% of the best matvec rate in the
  // experts'/weights' format (decode is bandwidth-bound; more threads than that only contend).
  const std::string hot_format = m.moe() ? m.expert_format : m.weight_format;
  std::map<int, double> timed_steps;
  for (auto& t : m.timings)
    if (t.step_seconds > 0 && t.threads >= 1 && t.threads <= d.topology.cores) timed_steps[t.threads] = t.step_seconds;
  if (request.threads) {
    p.threads = *request.threads;
    p.rationale.push_back({"threads", std::to_string(p.threads), "given", {}});
  } else if (timed_steps.size() >= 2) {
    double fastest = timed_steps.begin()->second;
    for (auto& [threads, step] : timed_steps) fastest = std::min(fastest, step);
    std::map<std::string, double> ms;
    p.threads = 0;
    for (auto& [threads, step] : timed_steps) {  // ascending thread counts: the first within 3% is the fewest
      ms[fmt::format("step_seconds@{}", threads)] = step;
      if (p.threads == 0 && step <= 1.03 * fastest) p.threads = threads;
    }
    p.rationale.push_back({"threads", std::to_string(p.threads), "fewest threads within 3% of the fastest measured decode step", ms});
  } else {
    double best = 0;
    for (auto& c : d.compute) best = std::max(best, matvec_gbs(d, c.threads, hot_format));
    p.threads = d.topology.cores;
    for (auto& c : d.compute)
      if (matvec_gbs(d, c.threads, hot_format) >= 0.97 * best) {
        p.threads = c.threads;
        break;
      }
    std::map<std::string, double> ms;
    for (auto& c : d.compute) ms[fmt::format("matvec_{}_gbs@{}", hot_format, c.threads)] = matvec_gbs(d, c.threads, hot_format);
    p.rationale.push_back({"threads", std::to_string(p.threads), "fewest threads within 3% of the best matvec GB/s", ms});
  }
  p.numa_placement = d.topology.numa_nodes > 1 ? fmt::format("interleave over {} nodes", d.topology.numa_nodes)
                                               : "single node";

  p.gpu_layers = 0;  // decided last, on top of the host plan (see plan_gpu)

  // Prefill chunk: the largest that keeps activation scratch within max(32 MiB, 3% of the budget); bigger chunks
  // make better GEMMs and read each weight (and expert) once for more tokens.
  const uint64_t scratch_cap = std::max<uint64_t>(32u << 20, p.budget_bytes / 33);
  p.prefill_chunk = 16;
  for (int64_t chunk : {512, 256, 128, 64, 32, 16})
    if (runtime_scratch_bytes(m, chunk, p.batch, p.threads) <= scratch_cap) {
      p.prefill_chunk = chunk;
      break;
    }
  const uint64_t scratch = runtime_scratch_bytes(m, p.prefill_chunk, p.batch, p.threads);
  // Loading stages each dense matrix whole (f32) in scratch before the runtime buffers, KV or expert cache exist;
  // with the head loaded last, the load peak is about the dense weights plus the largest staging. The ledger fails
  // the load loudly if that is over the budget, so the plan says so up front (it cannot change the load path).
  const uint64_t load_peak = m.dense_bytes() + m.load_scratch_bytes;
  if (load_peak > p.budget_bytes)
    p.rationale.push_back({"load_peak", mib(load_peak),
                           fmt::format("WARNING: loading stages {} in f32 on top of {} of dense weights, over the "
                                       "budget {}; raise --budget or load pre-quantized (MLX) weights",
                                       mib(m.load_scratch_bytes), mib(m.dense_bytes()), mib(p.budget_bytes)),
                           {{"load_scratch_bytes", double(m.load_scratch_bytes)}}});
  p.rationale.push_back({"prefill_chunk", std::to_string(p.prefill_chunk),
                         "largest chunk whose activations fit " + mib(scratch_cap),
                         {{"scratch_bytes", double(scratch)}}});

  // KV codec: the most exact (f32 first) whose cache fits in kKvShareOfFreeMemory of what the weights leave; else the
  // smallest that fits at all. Turbo codecs only where their measured perplexity cost is at most
  // kKvMaxPerplexityIncrease (f16 and q8 are near-exact: +0.002% / +0.07% on tests/fixtures/models/code-small).
  const uint64_t fixed_pre_kv = m.dense_bytes() + scratch + (m.moe() ? m.expert_conversion_bytes : 0);
  if (fixed_pre_kv > p.budget_bytes)
    throw PlanError(fmt::format("budget {} is below the model's dense weights + scratch ({}): raise --budget to at "
                                "least {} or use a smaller weight format",
                                mib(p.budget_bytes), mib(fixed_pre_kv), mib(fixed_pre_kv * 11 / 10)));
  const uint64_t free_for_kv = p.budget_bytes - fixed_pre_kv;
  auto kv_bytes = [&](const std::string& codec) {
    return kv_cache_bytes(m, codec, p.context, p.batch, p.prefill_chunk);
  };
  // KV comes before experts: the expert tier gets what KV leaves, down to its minimum cache (min_slots), so a short
  // budget trades expert slots (and resident experts) for KV; only a KV cache that leaves less than that fails.
  const int64_t min_slots = 2 * m.top_k;
  const uint64_t slot_bytes = m.expert_bytes + m.expert_staging_bytes;
  const uint64_t min_expert_bytes = m.moe() ? uint64_t(min_slots) * slot_bytes : 0;
  std::vector<std::string> codecs = {"f32", "f16", "q8", "turbo4", "turbo3"};
  std::map<std::string, double> kv_ms{{"free_bytes", double(free_for_kv)}};
  std::vector<std::string> usable_codecs;
  std::vector<std::string> quality_refused;  // codecs that would fit but whose quality cost is unmeasured or too high
  for (auto& c : codecs) try {
      kv_ms["kv_bytes_" + c] = double(kv_bytes(c));
      if (c.rfind("turbo", 0) == 0) {
        const auto measured = m.kv_perplexity_increase.find(c);
        if (measured != m.kv_perplexity_increase.end()) kv_ms["perplexity_increase_" + c] = measured->second;
        if (measured == m.kv_perplexity_increase.end() || measured->second > kKvMaxPerplexityIncrease) {
          quality_refused.push_back(measured == m.kv_perplexity_increase.end()
                                        ? c + " (quality not measured)"
                                        : fmt::format("{} (+{:.2f}% perplexity measured)", c, 100 * measured->second));
          continue;
        }
      }
      usable_codecs.push_back(c);
    } catch (const std::invalid_argument&) {
    }
  std::string refused_note;
  if (!quality_refused.empty()) {
    refused_note = fmt::format("; not chosen by quality (over {:.0f}% perplexity or unmeasured): ", kKvMaxPerplexityIncrease * 100);
    for (size_t i = 0; i < quality_refused.size(); ++i) refused_note += (i ? ", " : "") + quality_refused[i];
  }
  std::string because;
  if (request.kv_codec) {
    p.kv_codec = *request.kv_codec;
    kv_bytes_per_token(m, p.kv_codec);  // validates
    because = "given";
  } else {
    p.kv_codec.clear();
    for (auto& c : usable_codecs)
      if (double(kv_bytes(c)) <= kKvShareOfFreeMemory * double(free_for_kv)) {
        p.kv_codec = c;
        because = fmt::format("most exact codec within {:.0f}% of the memory the weights leave", kKvShareOfFreeMemory * 100);
        break;
      }
    if (p.kv_codec.empty() && kv_bytes(usable_codecs.back()) + min_expert_bytes <= free_for_kv) {
      p.kv_codec = usable_codecs.back();  // the smallest: the most memory left for experts
      because = "the smallest codec that fits";
    }
    if (p.kv_codec.empty())
      throw PlanError(fmt::format("context {} x batch {} does not fit: KV needs {} even with {}{}, {} is free after the "
                                  "weights; lower --context/--batch or raise --budget{}",
                                  p.context, p.batch, mib(kv_bytes(usable_codecs.back())), usable_codecs.back(),
                                  m.moe() ? fmt::format(" (+ {} for the minimum expert cache)", mib(min_expert_bytes)) : "",
                                  mib(free_for_kv),
                                  quality_refused.empty() ? ""
                                                          : " (or accept a lossier cache with --kv-codec: " +
                                                                refused_note.substr(2) + ")"));
    because += refused_note;
  }
  p.rationale.push_back({"kv_codec", p.kv_codec, because, kv_ms});
  const uint64_t fixed = fixed_pre_kv + kv_bytes(p.kv_codec);
  if (fixed > p.budget_bytes) throw PlanError("KV cache with codec " + p.kv_codec + " does not fit the budget");

  if (m.moe()) {
    const ReaderChoice reader = choose_reader(d.storage, m);
    p.reader_block_size = reader.block_size;
    p.reader_queue_depth = reader.queue_depth;
    p.reader_direct = d.storage.direct_io;
    p.rationale.push_back({"reader", fmt::format("block {} KiB, queue depth {}", reader.block_size / 1024, reader.queue_depth),
                           "the probed block and depth that read one layer's top_k missed experts soonest in the "
                           "fewest submissions (1: all their requests in flight at once): their bytes at the cell's "
                           "GB/s plus its CPU per request times their requests (within 5%: the fewest requests)",
                           {{"storage_gbs", reader.gbs}, {"expert_read_bytes", double(m.expert_read_bytes)},
                            {"requests_per_expert", double(reader.requests_per_expert)},
                            {"submissions", double(reader.submissions)},
                            {"predicted_read_seconds", reader.seconds}, {"iops_4k", d.storage.iops_4k()}}});

    // Resident experts vs cache slots: every split of the memory left is costed; the fastest predicted step wins.
    const uint64_t avail = p.budget_bytes - fixed;
    const int64_t total = m.moe_layers * m.experts;
    if (avail < uint64_t(min_slots) * slot_bytes)
      throw PlanError(fmt::format("budget {} leaves {} for experts; the expert cache needs at least {} slots ({}): raise "
                                  "--budget to at least {} or lower --context",
                                  mib(p.budget_bytes), mib(avail), min_slots, mib(uint64_t(min_slots) * slot_bytes),
                                  mib(fixed + uint64_t(min_slots) * slot_bytes)));
    const auto ranked = ranked_experts(m);
    const int64_t max_resident = std::min<int64_t>(total, int64_t((avail - uint64_t(min_slots) * slot_bytes) / m.expert_bytes));
    p.cache_policy = "lru";
    p.prefetch_limit = m.top_k;
    double best_step = 1e300;
    Plan best = p;
    const int steps = 16;
    for (int i = 0; i <= steps; ++i) {
      Plan candidate = p;
      const int64_t r = max_resident * i / steps;
      candidate.resident_experts = resident_set(m, ranked, r);
      candidate.cache_slots = std::min<int64_t>(int64_t((avail - uint64_t(r) * m.expert_bytes) / slot_bytes),
                                                std::max<int64_t>(total - r, min_slots));
      const StepCost c = evaluate(d, m, candidate, request.trace);
      if (c.step < best_step * 0.999 || (c.step <= best_step * 1.001 && r > best.resident_count())) {
        best_step = std::min(best_step, c.step);
        best = candidate;
      }
    }
    p.resident_experts = best.resident_experts;
    p.cache_slots = best.cache_slots;
    const StepCost chosen = evaluate(d, m, p, request.trace);
    p.rationale.push_back(
        {"experts", fmt::format("{} resident, {} cache slots", p.resident_count(), p.cache_slots),
         std::string("fastest predicted decode step over resident/slot splits of the memory left; hit rates ") +
             (request.trace ? "replayed on the router trace's held-out second half (resident set ranked on the first)"
                            : "from expert frequencies (LRU approximation)"),
         {{"available_bytes", double(avail)}, {"expert_bytes", double(m.expert_bytes)},
          {"hit_rate", chosen.prediction.expert_hit_rate}, {"total_experts", double(total)},
          {"traced_tokens", double(m.traced_tokens)}}});
  }
  plan_gpu(d, m, p, request);
  p.prediction = evaluate(d, m, p, request.trace).prediction;
  if (p.prediction.total_memory() > p.budget_bytes)
    throw PlanError(fmt::format("plan: predicted memory {} exceeds the budget {}", mib(p.prediction.total_memory()),
                                mib(p.budget_bytes)));
  if (vram_total(p.prediction) > p.gpu_budget_bytes)
    throw PlanError(fmt::format("plan: predicted VRAM {} exceeds the GPU budget {}", mib(vram_total(p.prediction)),
                                mib(p.gpu_budget_bytes)));
  return p;
}

}  // namespace

namespace {

// A plan on a router trace must not be judged on the tokens it was chosen on: a resident set taken from a short
// trace holds every expert that trace touched, and replaying the same trace then claims ~100% hits (Gemma-4-26B-A4B
// in bench/results/headline.md: 12.2 tok/s predicted, 0.5 measured). So the trace is split in two, in order (the
// prompts of the first half, the prompts of the second): the resident set is ranked by the first half's
// frequencies, the cache sized against hit rates replayed on the second half with the first half warming the LRU
// slots. A trace of fewer than 2 tokens teaches nothing: the hit rate then comes from the profile's frequencies.
struct HeldOut {
  ModelProfile model;
  RouterTrace trace;
  PlanRequest request;
};

std::optional<HeldOut> hold_out(const ModelProfile& m, const PlanRequest& request) {
  if (!request.trace || !m.moe() || !request.hold_out_trace || request.trace->held_out_from > 0) return std::nullopt;
  HeldOut h{m, *request.trace, request};
  const int64_t tokens = h.trace.tokens();
  if (tokens < 2) {
    h.request.trace = nullptr;
    return h;
  }
  h.trace.held_out_from = tokens / 2;
  h.model.expert_frequency = frequencies(h.trace, 0, h.trace.held_out_from);
  return h;  // make_plan points the request at the copy's trace
}

Plan make_plan_on(const DeviceProfile& d, const ModelProfile& m, const PlanRequest& request) {
  if (!request.fit_batch || request.batch <= 1) return plan_for_batch(d, m, request);
  // The batch is a default, not something the user asked for: halve it until its KV fits beside the weights and
  // the minimum expert cache, rather than fail; the plan records the batch it was sized for (serve's default).
  PlanRequest r = request;
  while (true) {
    try {
      Plan p = plan_for_batch(d, m, r);
      if (r.batch != request.batch)
        p.rationale.push_back({"batch", std::to_string(r.batch),
                               fmt::format("{} sequences of {} positions do not fit the budget {} beside the weights "
                                           "and the minimum expert cache; halved until they do",
                                           request.batch, request.context, mib(p.budget_bytes)),
                               {{"asked_batch", double(request.batch)}, {"kv_bytes", double(p.prediction.memory["kv"])}}});
      return p;
    } catch (const PlanError&) {
      if (r.batch <= 1) throw;
      r.batch = std::max<int64_t>(1, r.batch / 2);
    }
  }
}

}  // namespace

Plan make_plan(const DeviceProfile& d, const ModelProfile& m, const PlanRequest& request) {
  std::optional<HeldOut> h = hold_out(m, request);
  if (!h) return make_plan_on(d, m, request);
  h->request.trace = h->request.trace ? &h->trace : nullptr;  // the copy's own trace, not the moved-from one
  return make_plan_on(d, h->model, h->request);
}

}  // namespace tierlm::calibrate
