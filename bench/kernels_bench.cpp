// bench/kernels_bench.cpp — RAM bandwidth roofline, matvec GB/s per weight format (and its fraction of the read
// roofline), matmul tokens/s for prefill.
//
// Matvec cycles through enough copies of the weight (>= 512 MiB in all) that every call streams from DRAM, as a
// real decode step does; a single layer-sized matrix would otherwise sit in the 32 MiB L3.
// MLX rows (mlx_q4 / mlx_q8, group 64, bf16 scales) run with f32 activations (act 0, the default: MLX's semantics)
// and with the int8-activation kernels forced (act 1), and BM_MlxDecodeStep streams a whole Llama-3.2-1B-shaped
// model (16 layers + lm_head) per iteration: decode tok/s of each path.
// Run: build-kern/bench/kernels_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernels/affine_f32.h"
#include "runtime/kernels/bandwidth.h"
#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/weights.h"

namespace tk = tierlm::kernels;

namespace {

constexpr size_t kRooflineBytes = size_t{1} << 30;
constexpr uint64_t kStreamBytes = uint64_t{512} << 20;

tierlm::tiering::Ledger& bench_ledger() {
  static tierlm::tiering::Ledger ledger;
  return ledger;
}

// Read roofline per thread count, measured once per process with the same kind of pool the kernels use.
double read_roofline_gbs(int threads) {
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  tk::ThreadPool pool(threads);
  tk::BandwidthOptions o;
  o.repeats = 5;
  o.ledger = &bench_ledger();
  const double gbs = tk::measure_read_bandwidth_gbs(pool, kRooflineBytes, o);
  cache[threads] = gbs;
  return gbs;
}

std::vector<uint16_t> random_bf16(int64_t n) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  uint64_t s = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(n);
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    // Roughly N(0, 0.03): sum of two uniforms, scaled.
    const float u = (static_cast<float>(s & 0xFFFF) + static_cast<float>((s >> 16) & 0xFFFF)) / 65536.0f - 1.0f;
    x = tk::f32_to_bf16(u * 0.05f);
  }
  return v;
}

tk::Weight clone(const tk::Weight& w) {
  tk::Weight c;
  c.view = w.view;
  auto dup = [](const tierlm::tiering::LedgerBuffer& b) {
    if (b.empty()) return tierlm::tiering::LedgerBuffer();
    tierlm::tiering::LedgerBuffer out(bench_ledger(), "weights", b.size());
    std::memcpy(out.data(), b.data(), b.size());
    return out;
  };
  c.data = dup(w.data);
  c.scales = dup(w.scales);
  c.biases = dup(w.biases);
  c.view.data = c.data.data();
  c.view.scales = c.scales.empty() ? nullptr : c.scales.data();
  c.view.biases = c.biases.empty() ? nullptr : c.biases.data();
  return c;
}

// Random MLX affine weight: uniform codes, bf16 scales in [0.0005, 0.002) and biases in [-0.02, 0.02), group 64.
tk::Weight random_mlx(int bits, int64_t rows, int64_t cols) {
  constexpr int kGroup = 64;
  std::vector<uint32_t> packed(static_cast<size_t>(rows * cols * bits / 32));
  std::vector<uint16_t> scales(static_cast<size_t>(rows * cols / kGroup)), biases(scales.size());
  uint64_t s = 0x2545F4914F6CDD1Dull ^ static_cast<uint64_t>(rows * 31 + cols);
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (auto& word : packed) word = static_cast<uint32_t>(next());
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = tk::f32_to_bf16(0.0005f + 0.0015f * static_cast<float>(next() & 0xFFFF) / 65536.0f);
    biases[i] = tk::f32_to_bf16(0.04f * static_cast<float>(next() & 0xFFFF) / 65536.0f - 0.02f);
  }
  return tk::make_mlx_weight(packed.data(), scales.data(), biases.data(), tk::SourceType::bf16, rows, cols, kGroup,
                             bits, bench_ledger(), "weights");
}

bool is_mlx(tk::WeightFormat f) { return f == tk::WeightFormat::mlx_q4 || f == tk::WeightFormat::mlx_q8; }

// The last weight set built (format x shape), reused across thread counts; rebuilt when the key changes so at
// most one set lives at a time.
struct WeightSet {
  std::string key;
  std::vector<tk::Weight> copies;
};

const std::vector<tk::Weight>& weights_for(tk::WeightFormat f, int64_t rows, int64_t cols, bool stream) {
  static WeightSet set;
  const std::string key = std::string(tk::format_name(f)) + "/" + std::to_string(rows) + "x" + std::to_string(cols) +
                          (stream ? "/s" : "");
  if (set.key == key) return set.copies;
  set.copies.clear();
  set.key = key;
  if (is_mlx(f)) {
    set.copies.push_back(random_mlx(f == tk::WeightFormat::mlx_q4 ? 4 : 8, rows, cols));
  } else {
    const auto src = random_bf16(rows * cols);
    set.copies.push_back(tk::make_weight(src.data(), tk::SourceType::bf16, rows, cols, f, bench_ledger(), "weights"));
  }
  if (stream) {
    const uint64_t one = tk::weight_bytes(set.copies[0].view);
    const uint64_t copies = std::max<uint64_t>(1, (kStreamBytes + one - 1) / one);
    for (uint64_t i = 1; i < copies; ++i) set.copies.push_back(clone(set.copies[0]));
  }
  return set.copies;
}

std::vector<float> random_activation(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 7919) % 201 - 100) / 100.0f;
  return x;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  tk::ThreadPool pool(threads);
  tk::BandwidthOptions o;
  o.repeats = 3;
  o.ledger = &bench_ledger();
  double gbs = 0;
  for (auto _ : state) gbs = std::max(gbs, tk::measure_read_bandwidth_gbs(pool, kRooflineBytes, o));
  state.counters["bytes_per_second"] = gbs * 1e9;
}

void BM_CopyBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  tk::ThreadPool pool(threads);
  tk::BandwidthOptions o;
  o.repeats = 3;
  o.ledger = &bench_ledger();
  double gbs = 0;
  for (auto _ : state) gbs = std::max(gbs, tk::measure_copy_bandwidth_gbs(pool, kRooflineBytes / 2, o));
  state.counters["bytes_per_second"] = gbs * 1e9;
}

void BM_TriadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  tk::ThreadPool pool(threads);
  tk::BandwidthOptions o;
  o.repeats = 3;
  o.ledger = &bench_ledger();
  double gbs = 0;
  for (auto _ : state) gbs = std::max(gbs, tk::measure_triad_bandwidth_gbs(pool, kRooflineBytes / 2, o));
  state.counters["bytes_per_second"] = gbs * 1e9;
}

// MLX activations for the rest of one benchmark (act 0: f32, 1: int8), restored to the default at scope exit.
struct ActivationMode {
  explicit ActivationMode(int64_t act) {
    tk::set_mlx_activations_for_testing(act ? tk::MlxActivations::int8 : tk::MlxActivations::f32);
  }
  ~ActivationMode() { tk::set_mlx_activations_for_testing(tk::MlxActivations::f32); }
};

// Args: format, rows, cols, threads, act.
void BM_Matvec(benchmark::State& state) {
  const auto f = static_cast<tk::WeightFormat>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const ActivationMode mode(state.range(4));
  const double roofline = read_roofline_gbs(threads);
  const auto& copies = weights_for(f, rows, cols, true);
  tk::ThreadPool pool(threads);
  const auto x = random_activation(cols);
  std::vector<float> y(static_cast<size_t>(rows));
  size_t i = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    tk::matvec(copies[i].view, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    if (++i == copies.size()) i = 0;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes = static_cast<double>(tk::weight_bytes(copies[0].view));
  state.SetLabel(tk::format_name(f));
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["roofline_gbs"] = roofline;
  state.counters["roofline_frac"] = bytes * static_cast<double>(state.iterations()) / seconds / (roofline * 1e9);
}

// Args: format, rows, cols, threads, n, act.
void BM_Matmul(benchmark::State& state) {
  const auto f = static_cast<tk::WeightFormat>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const int64_t n = state.range(4);
  const ActivationMode mode(state.range(5));
  const auto& copies = weights_for(f, rows, cols, false);
  tk::ThreadPool pool(threads);
  const auto x = random_activation(n * cols);
  std::vector<float> y(static_cast<size_t>(n * rows));
  for (auto _ : state) {
    tk::matmul(copies[0].view, x.data(), n, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(tk::format_name(f));
  state.counters["tok_per_second"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gflops"] = benchmark::Counter(2.0 * static_cast<double>(n * rows * cols) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void matvec_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fmt", "rows", "cols", "threads", "act"});
  for (auto f : {tk::WeightFormat::q8_0, tk::WeightFormat::q4, tk::WeightFormat::mlx_q8, tk::WeightFormat::mlx_q4,
                 tk::WeightFormat::bf16, tk::WeightFormat::f16, tk::WeightFormat::f32}) {
    for (auto shape : {std::pair<int64_t, int64_t>{2048, 8192}, {8192, 2048}, {128256, 2048}}) {
      if (shape.first == 128256 && f == tk::WeightFormat::f32) continue;  // 1 GiB; bf16/f16 show the dense case
      for (int threads : {1, 2}) {
        for (int64_t act : {0, 1}) {
          if (act && !is_mlx(f)) continue;
          b->Args({static_cast<int64_t>(f), shape.first, shape.second, threads, act});
        }
      }
    }
  }
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fmt", "rows", "cols", "threads", "n", "act"});
  for (auto f : {tk::WeightFormat::q8_0, tk::WeightFormat::q4, tk::WeightFormat::mlx_q8, tk::WeightFormat::mlx_q4,
                 tk::WeightFormat::bf16, tk::WeightFormat::f32}) {
    for (auto shape : {std::pair<int64_t, int64_t>{2048, 8192}, {8192, 2048}}) {
      for (int64_t n : {4, 64, 256}) {
        for (int64_t act : {0, 1}) {
          if (act && !is_mlx(f)) continue;
          b->Args({static_cast<int64_t>(f), shape.first, shape.second, 2, n, act});
        }
      }
    }
  }
}

// One decode step's matrix work of a Llama-3.2-1B-shaped MLX model (hidden 2048, 16 layers of q/o 2048x2048, k/v
// 512x2048, gate+up 16384x2048, down 2048x8192, lm_head 128256x2048): every weight streamed once per iteration.
// Args: bits, threads, act.
void BM_MlxDecodeStep(benchmark::State& state) {
  const int bits = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const ActivationMode mode(state.range(2));
  static std::map<int, std::vector<tk::Weight>> models;  // per bit width, built once per process
  std::vector<tk::Weight>& model = models[bits];
  if (model.empty()) {
    const std::pair<int64_t, int64_t> layer[] = {{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048},
                                                 {16384, 2048}, {2048, 8192}};
    for (int l = 0; l < 16; ++l)
      for (auto [rows, cols] : layer) model.push_back(random_mlx(bits, rows, cols));
    model.push_back(random_mlx(bits, 128256, 2048));
  }
  tk::ThreadPool pool(threads);
  const auto x = random_activation(8192);
  std::vector<float> y(128256);
  uint64_t bytes = 0;
  for (const auto& w : model) bytes += tk::weight_bytes(w.view);
  for (auto _ : state) {
    for (const auto& w : model) tk::matvec(w.view, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["tok_per_second"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void decode_step_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bits", "threads", "act"});
  for (int64_t bits : {4, 8})
    for (int64_t threads : {1, 2})
      for (int64_t act : {0, 1}) b->Args({bits, threads, act});
}

}  // namespace

BENCHMARK(BM_ReadBandwidth)->ArgName("threads")->Arg(1)->Arg(2)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CopyBandwidth)->ArgName("threads")->Arg(1)->Arg(2)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TriadBandwidth)->ArgName("threads")->Arg(1)->Arg(2)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Matvec)->Apply(matvec_args)->Unit(benchmark::kMicrosecond)->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_Matmul)->Apply(matmul_args)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_MlxDecodeStep)->Apply(decode_step_args)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();

BENCHMARK_MAIN();
