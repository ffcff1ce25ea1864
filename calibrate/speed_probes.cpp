// calibrate/speed_probes.cpp — RAM bandwidth per NUMA node (runtime/kernels/bandwidth.h on a pool bound to the node)
// and compute by thread count: OpenBLAS SGEMM, our q8_0/q4/f16/bf16 matvec (decode) and the engine's own matmul per
// weight format (prefill); for a model, its own prefill shapes and per-row work (probe_prefill) and its attention as
// the KV cache runs it (probe_prefill_attention).
#include <cblas.h>
#include <malloc.h>
#include <numa.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include <spdlog/spdlog.h>

#include "calibrate/probes.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/engine/moe.h"
#include "runtime/engine/ops.h"
#include "runtime/kernels/bandwidth.h"
#include "runtime/kernels/weights.h"
#include "runtime/kv/codec.h"
#include "runtime/model/config.h"

namespace tierlm::calibrate {

namespace {

using Clock = std::chrono::steady_clock;

// Activation rows of the prefill GEMM probe: a short prompt's chunk (the engine's f16/bf16 GEMM kernel takes over
// from per-row matvecs above 16 rows).
constexpr int64_t kGemmProbeRows = 128;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// 1, 2, 4, ... and the core count itself.
std::vector<int> thread_counts(int cores) {
  std::vector<int> counts;
  for (int t = 1; t < cores; t *= 2) counts.push_back(t);
  counts.push_back(cores);
  return counts;
}

// Runs fn until `seconds` pass (at least twice: the first is warm-up) and returns the best rate of work/seconds.
template <class Fn>
double best_rate(double seconds, double work_per_call, Fn fn) {
  fn();
  double best = 0;
  const auto start = Clock::now();
  do {
    const auto t = Clock::now();
    fn();
    best = std::max(best, work_per_call / seconds_since(t));
  } while (seconds_since(start) < seconds);
  return best;
}

// As best_rate, but the median call's rate: for work the engine runs once per step, whose typical time is what a step
// pays (the expert lanes: their best call ran ~20% above the rate the engine's MoE blocks held, the device's Xeon).
template <class Fn>
double median_rate(double seconds, double work_per_call, Fn fn) {
  fn();
  std::vector<double> rates;
  const auto start = Clock::now();
  do {
    const auto t = Clock::now();
    fn();
    rates.push_back(work_per_call / seconds_since(t));
  } while (seconds_since(start) < seconds);
  std::nth_element(rates.begin(), rates.begin() + std::ptrdiff_t(rates.size() / 2), rates.end());
  return rates[rates.size() / 2];
}

// The probes' weights are random: their values do not change the kernels' speed. Uniform [-1, 1) floats and
// arbitrary 4-bit codes from a linear congruential `state`.
uint32_t next_random(uint32_t& state) { return state = state * 1664525u + 1013904223u; }
void fill_random(std::span<float> values, uint32_t& state) {
  for (float& v : values) v = float(int32_t(next_random(state) >> 8) - (1 << 23)) / float(1 << 23);
}
void fill_codes(std::span<uint32_t> words, uint32_t& state) {
  for (uint32_t& w : words) w = next_random(state);
}

// A [rows x cols] weight of `format` for the speed probes, charged to scratch: the dense and packed formats from the
// f32 `source`, MLX affine 4-bit (group 64, bf16 scales and biases of 1/128) and MXFP4 (scales 2^0, so every
// product is finite) from the 4-bit `codes` (rows * cols / 8 words).
kernels::Weight probe_weight(kernels::WeightFormat format, const float* source, const uint32_t* codes, int64_t rows,
                             int64_t cols, tiering::Ledger& ledger) {
  const char* scratch = tiering::accounts::scratch;
  if (format == kernels::WeightFormat::mlx_q4) {
    const std::vector<uint16_t> affine(size_t(rows * cols / 64), 0x3c00);
    return kernels::make_mlx_weight(codes, affine.data(), affine.data(), kernels::SourceType::bf16, rows, cols, 64, 4,
                                    ledger, scratch);
  }
  if (format == kernels::WeightFormat::mxfp4) {
    const std::vector<uint8_t> e8m0(size_t(rows * cols / 32), 127);
    return kernels::make_mxfp4_weight(codes, e8m0.data(), rows, cols, ledger, scratch);
  }
  return kernels::make_weight(source, kernels::SourceType::f32, rows, cols, format, ledger, scratch);
}

// MoE prefill's experts as the engine runs them (engine::MoeBlock's lanes, kLaneRows): a layer's experts at once,
// each pool thread taking pieces of experts' rows (as the engine cuts them) one after another on a serial pool with
// its own MatmulScratch, each its rows gathered, a gate_up GEMM, the SiLU gate and a down GEMM, then the outputs
// added to the residual by columns over the pool; kExpertProbeRows activation rows an expert; over distinct experts of Qwen3-30B-A3B's shape
// (2048 hidden, 768 intermediate, smaller under a small budget; a chunk's rows x top_k spread over the touched
// experts is a few to a few tens of rows each). A format whose experts take no lanes (engine::moe_lane_bytes 0) is
// timed as the engine runs it then: one expert after another, each GEMM split over the pool. Many small GEMMs run
// far below one large weight's rate: on an idle 16-core Xeon, MoE prefill measured 2.6x what the SGEMM probe
// predicted, and on a 2-core VM about what it predicted. Per format, the experts form a ring of up to 512 MiB
// (kExpertProbeBytes; an eighth of the probes' memory budget at most), each timed call the next
// kExpertsPerCall of it (a layer's touched experts).
constexpr int64_t kExpertProbeRows = 16;
// The experts' bytes the probe cycles through: far past a last-level cache, as a model's experts live in RAM. With
// 8 experts (~21 MB of q4) the probe ran from cache at 1.6x the engine's in-RAM MoE prefill rate on the 2-core VM
// (720 against 445 GFLOP/s; the ring: 494-534); on the device's Xeon the ring changed little
// (bench/results/fit-accuracy.md).
constexpr uint64_t kExpertProbeBytes = 512ull << 20;
constexpr int64_t kExpertsPerCall = 32;  // one timed call: a layer's touched experts, several per lane

// Another weight with `w`'s bytes in its own storage: the probes' streams of copies (a matvec's weight past the
// caches, the expert ring) differ only in where they live, and making hundreds by conversion would take seconds.
kernels::Weight copy_weight(const kernels::Weight& w, tiering::Ledger& ledger) {
  kernels::Weight c;
  c.view = w.view;
  auto copy = [&](const tiering::LedgerBuffer& from, tiering::LedgerBuffer& to) {
    if (from.empty()) return;
    to = tiering::LedgerBuffer(ledger, tiering::accounts::scratch, from.size());
    std::memcpy(to.data(), from.data(), from.size());
  };
  copy(w.data, c.data);
  copy(w.scales, c.scales);
  copy(w.biases, c.biases);
  // The view's pointers, each rebased from whichever of the three buffers it points into.
  auto rebase = [&](const void* p) -> const void* {
    if (!p) return nullptr;
    const auto* b = static_cast<const uint8_t*>(p);
    for (auto [from, to] :
         {std::pair{&w.data, &c.data}, std::pair{&w.scales, &c.scales}, std::pair{&w.biases, &c.biases}}) {
      const auto* base = static_cast<const uint8_t*>(from->data());
      if (from->size() && b >= base && b < base + from->size()) return static_cast<uint8_t*>(to->data()) + (b - base);
    }
    throw std::logic_error("copy_weight: a view pointer outside the weight's storage");
  };
  c.view.data = rebase(w.view.data);
  c.view.scales = rebase(w.view.scales);
  c.view.biases = rebase(w.view.biases);
  return c;
}

// The lanes' rate (GFLOP/s) of experts of `format` with a [2I x H] gate_up and an [H x I] down, R activation rows
// each, at each of `thread_counts` (record(threads, gflops)); their ring within `budget` / 8 and kExpertProbeBytes.
void time_expert_lanes(kernels::WeightFormat format, int64_t H, int64_t I, int64_t R, std::span<const int> thread_counts,
                       uint64_t budget, double seconds, tiering::Ledger& ledger,
                       const std::function<void(int, double)>& record) {
  const int64_t values = 3 * I * H, down = 2 * I * H;  // gate_up [2I x H], then down [H x I]
  tiering::LedgerBuffer source(ledger, tiering::accounts::scratch, size_t(values) * sizeof(float));
  tiering::LedgerBuffer codes(ledger, tiering::accounts::scratch, size_t(values / 2) + 4);  // 4 bits per weight
  uint32_t state = 777;
  fill_random(std::span(source.as<float>(), size_t(values)), state);
  fill_codes(std::span(codes.as<uint32_t>(), size_t(values / 8)), state);
  auto expert = [&] {
    return std::pair{probe_weight(format, source.as<float>(), codes.as<uint32_t>(), 2 * I, H, ledger),
                     probe_weight(format, source.as<float>() + down, codes.as<uint32_t>() + down / 8, H, I, ledger)};
  };
  int threads = 1;
  for (int t : thread_counts) threads = std::max(threads, t);
  // The input, then per lane its gathered rows, gate_up output and activation (lanes) or gate_up and down outputs
  // (one expert after another); the lanes' outputs (kExpertsPerCall experts of R rows), the residual they add to.
  const int64_t lane_floats = R * (H + 3 * I);
  tiering::LedgerBuffer activations(
      ledger, tiering::accounts::scratch,
      size_t(R * H + threads * lane_floats + kExpertsPerCall * R * H + R * H) * sizeof(float));
  float* x = activations.as<float>();
  float* outputs = x + R * H + threads * lane_floats;
  float* residual = outputs + kExpertsPerCall * R * H;
  for (int64_t i = 0; i < R * H; ++i) x[i] = float((i * 7) % 13) * 0.125f - 0.75f;
  std::fill(residual, residual + R * H, 0.0f);
  const double flops = 2.0 * double(R) * double(values);
  kernels::ThreadPool serial(1, false);
  std::vector<std::pair<kernels::Weight, kernels::Weight>> experts;
  experts.push_back(expert());
  const uint64_t each = kernels::weight_bytes(experts[0].first.view) + kernels::weight_bytes(experts[0].second.view);
  const int64_t count =
      std::clamp<int64_t>(int64_t(std::min(budget / 8, kExpertProbeBytes) / std::max<uint64_t>(each, 1)), 1, 4096);
  while (int64_t(experts.size()) < count)
    experts.emplace_back(copy_weight(experts[0].first, ledger), copy_weight(experts[0].second, ledger));
  const bool lanes = engine::moe_lane_bytes(format, H, I, experts[0].first.view.group_size, R) > 0;
  std::vector<std::unique_ptr<kernels::MatmulScratch>> scratch;
  for (int t = 0; t < threads && lanes; ++t) {
    scratch.push_back(std::make_unique<kernels::MatmulScratch>(ledger));
    scratch.back()->reserve(engine::moe_lane_matmul_sizes(format, H, I, experts[0].first.view.group_size, R));
  }
  for (int pool_threads : thread_counts) {
    kernels::ThreadPool pool(pool_threads);
    // Each call takes the next kExpertsPerCall experts of the ring, the ones touched longest ago.
    const int64_t per_call = std::min(kExpertsPerCall, count);
    int64_t next = 0;
    record(pool_threads, median_rate(seconds, flops * double(per_call) / 1e9, [&] {
      // (the activation's values do not change the time)
      if (!lanes) {
        float* ffn = x + R * H;
        for (int64_t i = 0; i < per_call; ++i) {
          auto& [gate_up, down_proj] = experts[size_t((next + i) % count)];
          kernels::matmul(gate_up.view, x, R, ffn, pool);
          kernels::matmul(down_proj.view, ffn, R, ffn + R * 2 * I, pool);
        }
      } else {
        // In pieces of rows as the engine cuts them.
        const int64_t piece = engine::lane_piece_rows(per_call * R, pool_threads, std::min(engine::kLaneRows, R));
        const int64_t parts = (R + piece - 1) / piece, pieces = per_call * parts;
        // Each piece as MoeBlock::expert_rows runs it (gather, gate_up, SiLU gate, down into the outputs), then
        // the outputs added to the residual by columns over the pool, as the block adds them.
        std::atomic<int64_t> taken{0};
        pool.parallel_for(std::min<int64_t>(pool_threads, pieces), [&](int64_t, int64_t, int t) {
          kernels::MatmulScratch::Scope scope(*scratch[size_t(t)]);
          float* gathered = x + R * H + t * lane_floats;
          float* ffn = gathered + R * H;
          float* act = ffn + R * 2 * I;
          for (int64_t i = taken.fetch_add(1); i < pieces; i = taken.fetch_add(1)) {
            auto& [gate_up, down_proj] = experts[size_t((next + i / parts) % count)];
            const int64_t r0 = (i % parts) * piece, rows = std::min(R, r0 + piece) - r0;
            for (int64_t r = 0; r < rows; ++r)
              std::memcpy(gathered + r * H, x + (r0 + r) * H, size_t(H) * sizeof(float));
            kernels::matmul(gate_up.view, gathered, rows, ffn, serial);
            for (int64_t r = 0; r < rows; ++r) engine::silu_gate(ffn + r * 2 * I, I, act + r * I);
            kernels::matmul(down_proj.view, act, rows, outputs + ((i / parts) * R + r0) * H, serial);
          }
        });
        pool.parallel_for((H + 63) / 64, [&](int64_t b, int64_t e, int) {
          const int64_t c0 = b * 64, c1 = std::min(H, e * 64);
          for (int64_t row = 0; row < per_call * R; ++row) {
            float* h = residual + (row % R) * H;
            const float* y = outputs + row * H;
            for (int64_t j = c0; j < c1; ++j) h[j] += 0.125f * y[j];
          }
        });
      }
      next = (next + per_call) % count;
    }));
  }
}

template <class Step>
void probe_expert_gemm(std::vector<ComputeSample>& samples, uint64_t budget, double slice, tiering::Ledger& ledger,
                       Step step) {
  using kernels::WeightFormat;
  // Qwen3-30B-A3B's expert shape, halved while its f32 source would take more than an eighth of the budget (a
  // small cgroup's calibration keeps its bound; the experts then stay within another eighth), down to 512 x 192:
  // the intermediate stays a multiple of the MLX group (64).
  int64_t H = 2048, I = 768;
  while (H > 512 && uint64_t(3 * I * H) * sizeof(float) > budget / 8) H /= 2, I /= 2;
  std::vector<int> thread_counts;
  for (const ComputeSample& s : samples) thread_counts.push_back(s.threads);
  // f32 too: a transformers-made model's experts stay f32 unless converted. Their GEMMs run on the dense kernel's
  // lanes, or without AVX-512 on OpenBLAS, one expert after another (fit once priced those at the SGEMM probe plus a
  // stream of each expert: 11.7-12.8 ms of a 128-row chunk where the engine spent 18.6-32.8, fit_accuracy_bench's
  // in-RAM MoE on the device's Xeon).
  for (WeightFormat format : {WeightFormat::q4, WeightFormat::q8_0, WeightFormat::mlx_q4, WeightFormat::mxfp4,
                              WeightFormat::bf16, WeightFormat::f16, WeightFormat::f32})
    time_expert_lanes(format, H, I, kExpertProbeRows, thread_counts, budget, slice / 4, ledger,
                      [&](int threads, double gflops) {
                        for (ComputeSample& s : samples)
                          if (s.threads == threads) s.expert_gemm_gflops[kernels::format_name(format)] = gflops;
                      });
  for (size_t i = 0; i < samples.size(); ++i) step();
}

}  // namespace

std::vector<NodeBandwidth> probe_bandwidth(const Topology& topology, const ProbeOptions& options) {
  const bool numa = numa_available() >= 0 && topology.numa_nodes > 1;
  const int nodes = numa ? topology.numa_nodes : 1;
  // One buffer of `bytes` at a time (copy: two halves, triad: three thirds), within the probes' memory budget.
  size_t bytes = options.quick ? (256u << 20) : (1u << 30);
  if (options.memory_budget) bytes = std::max<size_t>(std::min<size_t>(bytes, options.memory_budget), 1u << 20);
  kernels::BandwidthOptions bw;
  bw.repeats = options.quick ? 3 : 5;
  tiering::Ledger ledger;
  bw.ledger = &ledger;
  std::vector<NodeBandwidth> result;
  if (options.progress) options.progress("ram bandwidth", 0, size_t(nodes));
  for (int node = 0; node < nodes; ++node) {
    if (numa) {
      numa_run_on_node(node);  // the pool's threads inherit this binding (pin = false)
      numa_set_preferred(node);
    }
    const int threads = std::max(1, topology.cores / nodes);
    NodeBandwidth b;
    b.node = node;
    {
      kernels::ThreadPool pool(threads, /*pin=*/!numa);
      b.threads = pool.size();
      b.read_gbs = kernels::measure_read_bandwidth_gbs(pool, bytes, bw);
      b.copy_gbs = kernels::measure_copy_bandwidth_gbs(pool, bytes / 2, bw);
      b.triad_gbs = kernels::measure_triad_bandwidth_gbs(pool, bytes / 3, bw);
    }
    result.push_back(b);
    if (options.progress) options.progress("ram bandwidth", size_t(node + 1), size_t(nodes));
  }
  if (numa) {
    numa_run_on_node(-1);
    numa_set_localalloc();
  }
  malloc_trim(0);
  return result;
}

std::vector<ComputeSample> probe_compute(const Topology& topology, const ProbeOptions& options) {
  const std::vector<int> counts = thread_counts(topology.cores);
  const double slice = options.seconds_per_probe / double(counts.size() * 5);
  tiering::Ledger ledger;
  const size_t total = counts.size() * 7 + 1;
  size_t done = 0;
  auto progress = [&] {
    if (options.progress) options.progress("compute", done, total);
  };
  progress();

  // Sizes within the probes' memory budget: the f32 source matrix at most a quarter of it, the GEMM's three
  // matrices at most an eighth, and the streamed copies of one format (never both formats at once) the rest.
  const uint64_t budget = options.memory_budget ? options.memory_budget : ~uint64_t(0);
  int64_t dim = 4096;
  while (dim > 512 && uint64_t(dim * dim) * sizeof(float) * 4 > budget) dim /= 2;
  const int64_t rows = dim, cols = dim;
  int n = options.quick ? 512 : 1024;
  while (n > 128 && uint64_t(3) * uint64_t(n) * uint64_t(n) * sizeof(float) * 8 > budget) n /= 2;

  // Decode's matvec: copies of one weight, together at least 4x the last-level cache (and 256 MiB) where memory
  // allows, cycled so each call streams from RAM as a layer's weights do.
  uint64_t llc = 0;
  for (auto& c : topology.caches) llc = std::max(llc, c.bytes);
  const uint64_t wanted = std::max<uint64_t>(4 * llc, 256ull << 20);
  const uint64_t source_bytes = uint64_t(rows * cols) * sizeof(float), gemm_bytes = uint64_t(3) * n * n * sizeof(float);
  // The f32, q8, q4, f16, bf16, MLX q4 and MXFP4 originals (about 2.6x the f32 source together) and the GEMM probe's
  // activations stay while one format's copies stream.
  const uint64_t fixed = source_bytes * 21 / 8 + gemm_bytes + uint64_t(kGemmProbeRows) * uint64_t(rows + cols) * 4;
  const uint64_t stream_bytes = std::min(wanted, budget > fixed ? budget - fixed : source_bytes / 4);
  if (stream_bytes < wanted)
    spdlog::info("[calibrate] matvec probe streams {:.0f} MiB per format (wanted {:.0f} MiB: 4x the {:.0f} MiB "
                 "last-level cache, at least 256 MiB), bounded by the probes' {:.0f} MiB{}",
                 double(stream_bytes) / (1 << 20), double(wanted) / (1 << 20), double(llc) / (1 << 20),
                 double(budget) / (1 << 20),
                 stream_bytes < 4 * llc ? "; the cache may flatter the matvec rates" : "");
  tiering::LedgerBuffer source(ledger, tiering::accounts::scratch, size_t(source_bytes));
  float* src = source.as<float>();
  uint32_t state = 12345;
  fill_random(std::span(src, size_t(rows * cols)), state);
  auto original = [&](kernels::WeightFormat format, const uint32_t* codes = nullptr) {
    return probe_weight(format, src, codes, rows, cols, ledger);
  };
  kernels::Weight q8_original = original(kernels::WeightFormat::q8_0);
  kernels::Weight q4_original = original(kernels::WeightFormat::q4);
  kernels::Weight f16_original = original(kernels::WeightFormat::f16);
  kernels::Weight bf16_original = original(kernels::WeightFormat::bf16);
  kernels::Weight f32_original = original(kernels::WeightFormat::f32);
  source.reset();
  // MLX affine 4-bit and MXFP4 from arbitrary codes (probe_weight), once the f32 source is gone.
  kernels::Weight mlx_original, mxfp4_original;
  {
    tiering::LedgerBuffer codes(ledger, tiering::accounts::scratch, size_t(rows * cols / 2));  // 4 bits per weight
    fill_codes(std::span(codes.as<uint32_t>(), size_t(rows * cols / 8)), state);
    mlx_original = original(kernels::WeightFormat::mlx_q4, codes.as<uint32_t>());
    mxfp4_original = original(kernels::WeightFormat::mxfp4, codes.as<uint32_t>());
  }
  // Views of `first` and its copies, together at least stream_bytes.
  std::vector<kernels::Weight> copies;
  auto stream_of = [&](const kernels::Weight& first) {
    copies.clear();
    std::vector<kernels::WeightView> views{first.view};
    const uint64_t each = std::max<uint64_t>(kernels::weight_bytes(first.view), 1);
    copies.reserve(size_t(stream_bytes / each) + 1);
    for (uint64_t total = each; total < stream_bytes; total += each) {
      copies.push_back(copy_weight(first, ledger));
      views.push_back(copies.back().view);
    }
    return views;
  };
  tiering::LedgerBuffer vectors(ledger, tiering::accounts::scratch, size_t(rows + cols) * sizeof(float));
  float* x = vectors.as<float>();
  float* y = x + cols;
  std::fill(x, x + cols, 0.5f);
  ++done;
  progress();
  auto matvec_gbs = [&](const std::vector<kernels::WeightView>& views, kernels::ThreadPool& pool) {
    double bytes = 0;
    for (auto& v : views) bytes += double(kernels::weight_bytes(v));
    return best_rate(slice, bytes / 1e9, [&] {
      for (auto& v : views) kernels::matvec(v, x, y, pool);
    });
  };

  // Prefill's GEMM: square SGEMM, 2n^3 flops.
  tiering::LedgerBuffer gemm(ledger, tiering::accounts::scratch, size_t(gemm_bytes));
  float* a = gemm.as<float>();
  float* b = a + size_t(n) * n;
  float* cm = b + size_t(n) * n;
  for (size_t i = 0; i < size_t(n) * n * 2; ++i) a[i] = float(i % 17) * 0.0625f;
  const int blas_threads = openblas_get_num_threads();

  std::vector<ComputeSample> result;
  {
    const std::vector<kernels::WeightView> q8 = stream_of(q8_original);
    for (int t : counts) {
      ComputeSample s;
      s.threads = t;
      openblas_set_num_threads(t);
      s.sgemm_gflops = best_rate(slice, 2.0 * n * n * n / 1e9, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, cm, n);
      });
      ++done;
      progress();
      kernels::ThreadPool pool(t);
      s.matvec_q8_gbs = matvec_gbs(q8, pool);
      ++done;
      progress();
      result.push_back(s);
    }
  }
  openblas_set_num_threads(blas_threads);
  gemm.reset();
  copies.clear();
  malloc_trim(0);  // the q8 copies' heap pages go back before the q4 copies are made
  {
    const std::vector<kernels::WeightView> q4 = stream_of(q4_original);  // the q8 copies are freed first
    for (ComputeSample& s : result) {
      kernels::ThreadPool pool(s.threads);
      s.matvec_q4_gbs = matvec_gbs(q4, pool);
      ++done;
      progress();
    }
  }
  // Dense f16 / bf16 weights (as stored by most checkpoints) widen to f32 inside the matvec: their rate is the
  // kernel's, not the RAM's, and differs between the two. f32 weights (the project's synthetic models) stream with
  // no conversion: on the 2-core VM 17% above the q8 rate they took before (32.8 against 28.1 GB/s at 2 threads);
  // on the device's Xeon about the same.
  for (auto [original, rate] : {std::pair{&f16_original, &ComputeSample::matvec_f16_gbs},
                                std::pair{&bf16_original, &ComputeSample::matvec_bf16_gbs},
                                std::pair{&f32_original, &ComputeSample::matvec_f32_gbs}}) {
    copies.clear();
    malloc_trim(0);
    const std::vector<kernels::WeightView> dense = stream_of(*original);
    for (ComputeSample& s : result) {
      kernels::ThreadPool pool(s.threads);
      s.*rate = matvec_gbs(dense, pool);
      ++done;
      progress();
    }
  }
  copies.clear();
  malloc_trim(0);
  // Prefill's GEMM as the engine runs it: kernels::matmul of kGemmProbeRows activation rows by one weight of each
  // format (our dense f32/f16/bf16 GEMM kernel, or OpenBLAS without AVX-512; the packed q8_0/q4 matmul; the MLX
  // affine and MXFP4 kernels). At that many rows each weight byte feeds hundreds of flops, so the weight fits or not
  // in the cache changes little: one weight, not a stream of copies.
  {
    tiering::LedgerBuffer activations(ledger, tiering::accounts::scratch,
                                      size_t(kGemmProbeRows) * size_t(rows + cols) * sizeof(float));
    float* xs = activations.as<float>();
    float* ys = xs + size_t(kGemmProbeRows) * size_t(cols);
    for (int64_t i = 0; i < kGemmProbeRows * cols; ++i) xs[i] = float((i * 7) % 13) * 0.125f - 0.75f;
    const double flops = 2.0 * double(kGemmProbeRows) * double(rows) * double(cols) / 1e9;
    const double flops16 = 2.0 * 16 * double(rows) * double(cols) / 1e9;
    const std::pair<const char*, const kernels::Weight*> formats[] = {
        {"f32", &f32_original}, {"f16", &f16_original}, {"bf16", &bf16_original}, {"q8_0", &q8_original},
        {"q4", &q4_original},   {"mlx_q4", &mlx_original}, {"mxfp4", &mxfp4_original}};
    for (ComputeSample& s : result) {
      kernels::ThreadPool pool(s.threads);
      openblas_set_num_threads(s.threads);
      for (auto [name, weight] : formats) {
        s.matmul_gflops[name] = best_rate(slice / 2, flops, [&] {
          kernels::matmul(weight->view, xs, kGemmProbeRows, ys, pool);
        });
        s.matmul16_gflops[name] = best_rate(slice / 4, flops16, [&] { kernels::matmul(weight->view, xs, 16, ys, pool); });
      }
      ++done;
      progress();
    }
    openblas_set_num_threads(blas_threads);
  }
  // The originals go before the expert probe, which then has the budget's quarter to itself.
  for (kernels::Weight* w : {&q8_original, &q4_original, &f16_original, &bf16_original, &f32_original, &mlx_original,
                             &mxfp4_original})
    *w = kernels::Weight{};
  copies.clear();
  malloc_trim(0);
  probe_expert_gemm(result, budget, slice, ledger, [&] {
    ++done;
    progress();
  });
  return result;
}

PrefillRates probe_prefill(const ModelProfile& m, int threads, const std::string& kv_codec,
                           const ProbeOptions& options) {
  using kernels::WeightFormat;
  WeightFormat format = kernels::format_from_name(m.weight_format).value_or(WeightFormat::f32);
  if (format == WeightFormat::mlx_q8) format = WeightFormat::mlx_q4;  // one affine kernel for both (probe_weight: 4-bit)
  std::vector<GemmShape> shapes = m.dense_gemm_shapes();
  std::erase_if(shapes, [](const GemmShape& s) { return s.out <= 0 || s.in <= 0; });  // a shape the model lacks
  const int64_t most_rows = std::end(kPrefillShapeRows)[-1];
  const uint64_t budget = options.memory_budget ? options.memory_budget : ~uint64_t(0);
  // Each shape's rows: all of them, or a slice (a multiple of 64) whose f32 source fits a quarter of the budget and
  // whose largest call stays under kPrefillShapeFlops.
  std::vector<int64_t> outs;
  int64_t widest_in = 1, widest_out = 1, most_values = 1;
  for (const GemmShape& s : shapes) {
    const int64_t fit = std::min<int64_t>(int64_t(budget / 4 / (uint64_t(s.in) * sizeof(float))),
                                          int64_t(kPrefillShapeFlops / (2.0 * double(most_rows) * double(s.in))));
    const int64_t out = fit >= s.out ? s.out : std::max<int64_t>(fit / 64 * 64, 64);
    outs.push_back(out);
    widest_in = std::max(widest_in, s.in);
    widest_out = std::max(widest_out, out);
    most_values = std::max(most_values, out * s.in);
  }
  tiering::Ledger ledger;
  const char* scratch = tiering::accounts::scratch;
  tiering::LedgerBuffer source(ledger, scratch, size_t(most_values) * sizeof(float));
  tiering::LedgerBuffer codes(ledger, scratch, size_t(most_values) / 2 + 4);  // 4 bits per weight
  uint32_t state = 4242;
  fill_random(std::span(source.as<float>(), size_t(most_values)), state);
  fill_codes(std::span(codes.as<uint32_t>(), size_t(most_values) / 8), state);
  tiering::LedgerBuffer activations(ledger, scratch, size_t(most_rows) * size_t(widest_in + widest_out) * sizeof(float));
  float* x = activations.as<float>();
  float* y = x + most_rows * widest_in;
  for (int64_t i = 0; i < most_rows * widest_in; ++i) x[i] = float((i * 7) % 13) * 0.125f - 0.75f;
  kernels::ThreadPool pool(threads);
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(threads);  // f32 weights go through OpenBLAS without AVX-512
  const double slice = options.seconds_per_probe / double(std::max<size_t>(shapes.size(), 1) * std::size(kPrefillShapeRows));
  PrefillRates result;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape& s = shapes[i];
    const kernels::Weight w = probe_weight(format, source.as<float>(), codes.as<uint32_t>(), outs[i], s.in, ledger);
    PrefillGemm g{s.kind, m.weight_format, outs[i], s.in, threads, {}, {}};
    for (int64_t rows : kPrefillShapeRows) {
      g.rows.push_back(rows);
      g.gflops.push_back(best_rate(slice, 2.0 * double(rows) * double(outs[i]) * double(s.in) / 1e9,
                                   [&] { kernels::matmul(w.view, x, rows, y, pool); }));
    }
    result.gemms.push_back(std::move(g));
  }
  openblas_set_num_threads(blas_threads);
  // The per-row work on one thread, on rows of the model's intermediate (the gate) and hidden width (a pass), from
  // the activations already in cache: what each element costs, not the RAM.
  const int64_t I = std::max<int64_t>(std::max(m.intermediate, m.moe_intermediate), 1), H = std::max<int64_t>(m.hidden, 1);
  std::vector<float> gate_up(size_t(2 * I), 0.5f), act(size_t(I), 0.0f), weight(size_t(H), 1.0f), row(size_t(H), 0.0f);
  for (int64_t i = 0; i < 2 * I; ++i) gate_up[size_t(i)] = float((i * 7) % 13) * 0.125f - 0.75f;
  std::vector<float> hidden(gate_up.begin(), gate_up.begin() + std::min<int64_t>(2 * I, H));
  hidden.resize(size_t(H), 0.25f);
  const double rows_slice = std::max(0.02, options.seconds_per_probe / 20);
  result.gate_seconds = 1.0 / best_rate(rows_slice, double(I), [&] { engine::silu_gate(gate_up.data(), I, act.data()); });
  result.row_seconds = 1.0 / best_rate(rows_slice, double(H), [&] {
    engine::rms_norm(hidden.data(), weight.data(), H, 1e-6, row.data());
  });
  // Attention: 128 rows attend over [0, 128) at ~0.8-3 ns a head-position, where the f32 GEMM rate the planner
  // otherwise divides its flops by made it 0.24-0.8 ms of a chunk the engine spent 1.4-3.8 ms on (fit_accuracy_bench's
  // MoE, the device's 16-core Xeon and the 2-core VM). Only where every layer is plain attention of the model-wide
  // shape (no windows, recurrent, latent or per-layer heads), which is what the probe runs.
  const bool plain = m.layer_windows.empty() && m.layer_recurrent_bytes.empty() && m.layer_latent_floats.empty() &&
                     m.layer_kv_heads.empty() && m.layer_head_dims.empty();
  if (plain && m.heads > 0 && m.kv_heads > 0 && m.heads % m.kv_heads == 0 && m.head_dim > 0) {
    ProbeOptions attention = options;
    attention.seconds_per_probe = std::max(0.05, options.seconds_per_probe / 4);
    result.attention_seconds = probe_prefill_attention(m, threads, kv_codec, attention);
    result.attention_threads = threads;
    result.attention_codec = kv_codec;
  }
  // The model's own experts on the lanes at the plan's threads, as many rows each as a 128-row chunk gives them
  // (rows x top_k over the experts). Shapes the probe weights cannot take (a dimension not a multiple of 64: MLX's
  // group) are left to the device's expert probe.
  if (m.moe() && m.hidden % 64 == 0 && m.moe_intermediate % 64 == 0 && m.moe_intermediate > 0 && m.experts > 0)
    if (std::optional<WeightFormat> ef = kernels::format_from_name(m.expert_format)) {
      if (*ef == WeightFormat::mlx_q8) ef = WeightFormat::mlx_q4;  // one affine kernel for both
      const int64_t rows = std::clamp<int64_t>((128 * std::max<int64_t>(m.top_k, 1) + m.experts - 1) / m.experts, 1, 128);
      const int counts[1] = {threads};
      time_expert_lanes(*ef, m.hidden, m.moe_intermediate, rows, counts, budget,
                        std::max(0.05, options.seconds_per_probe / 4), ledger, [&](int, double gflops) {
                          result.expert_gflops = gflops;
                        });
      result.expert_threads = threads;
      result.expert_rows = rows;
      result.expert_format = m.expert_format;
    }
  return result;
}

double probe_prefill_attention(const ModelProfile& m, int threads, const std::string& codec,
                               const ProbeOptions& options) {
  constexpr int64_t rows = 128;
  model::ModelConfig config;
  config.model_type = "llama";
  config.arch = *model::find_architecture("llama");
  config.num_layers = 1;
  config.num_heads = m.heads;
  config.num_kv_heads = m.kv_heads;
  config.head_dim = m.head_dim;
  config.hidden_size = m.heads * m.head_dim;
  config.vocab_size = 1;
  config.max_position_embeddings = rows;
  tiering::Ledger ledger;
  engine::KVCacheOptions kv;
  kv.codec = kv::parse_codec(codec);
  engine::KVCache cache(config, rows, ledger, kv);
  const int64_t q_rows = m.heads * m.head_dim, kv_rows = m.kv_heads * m.head_dim, group = m.heads / m.kv_heads;
  tiering::LedgerBuffer buffers(ledger, tiering::accounts::scratch, size_t(rows) * size_t(2 * q_rows + 2 * kv_rows) * 4);
  float* q = buffers.as<float>();
  float* out = q + rows * q_rows;
  float* k = out + rows * q_rows;
  float* v = k + rows * kv_rows;
  uint32_t state = 99;
  fill_random(std::span(q, size_t(rows * (2 * q_rows + 2 * kv_rows))), state);
  cache.will_write(rows);
  for (int64_t pos = 0; pos < rows; ++pos) cache.store(0, pos, k + pos * kv_rows, v + pos * kv_rows);
  kernels::ThreadPool pool(threads);
  const double head_positions = double(m.heads) * double(rows) * double(rows + 1) / 2;
  const double rate = best_rate(options.seconds_per_probe, head_positions, [&] {
    pool.parallel_for(rows * m.kv_heads, [&](int64_t begin, int64_t end, int) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / m.kv_heads, g = item % m.kv_heads;
        cache.attend(0, g, q + i * q_rows + g * group * m.head_dim, group, i + 1, out + i * q_rows + g * group * m.head_dim);
      }
    });
  });
  return 1.0 / rate;
}

}  // namespace tierlm::calibrate
