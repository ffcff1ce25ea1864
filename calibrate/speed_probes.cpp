// calibrate/speed_probes.cpp — RAM bandwidth per NUMA node (runtime/kernels/bandwidth.h on a pool bound to the node)
// and compute by thread count: OpenBLAS SGEMM (prefill's batched GEMM) and our q8_0/q4 matvec (decode).
#include <cblas.h>
#include <numa.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "calibrate/probes.h"
#include "runtime/kernels/bandwidth.h"
#include "runtime/kernels/weights.h"

namespace tierlm::calibrate {

namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

std::vector<NodeBandwidth> probe_bandwidth(const Topology& topology, const ProbeOptions& options) {
  const bool numa = numa_available() >= 0 && topology.numa_nodes > 1;
  const int nodes = numa ? topology.numa_nodes : 1;
  const size_t bytes = options.quick ? (256u << 20) : (1u << 30);
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
  return result;
}

std::vector<ComputeSample> probe_compute(const Topology& topology, const ProbeOptions& options) {
  const std::vector<int> counts = thread_counts(topology.cores);
  const double slice = options.seconds_per_probe / double(counts.size() * 3);
  tiering::Ledger ledger;
  const size_t total = counts.size() * 3 + 1;
  size_t done = 0;
  auto progress = [&] {
    if (options.progress) options.progress("compute", done, total);
  };
  progress();

  // Decode's matvec: copies of one 4096x4096 weight, together at least 4x the last-level cache (and 256 MiB), cycled
  // so each call streams from RAM as a layer's weights do.
  const int64_t rows = 4096, cols = 4096;
  uint64_t llc = 0;
  for (auto& c : topology.caches) llc = std::max(llc, c.bytes);
  const uint64_t stream_bytes = std::max<uint64_t>(4 * llc, 256ull << 20);
  tiering::LedgerBuffer source(ledger, tiering::accounts::scratch, size_t(rows * cols) * sizeof(float));
  float* src = source.as<float>();
  uint32_t state = 12345;
  for (int64_t i = 0; i < rows * cols; ++i) {
    state = state * 1664525u + 1013904223u;
    src[i] = float(int32_t(state >> 8) - (1 << 23)) / float(1 << 23);
  }
  auto copies_of = [&](kernels::WeightFormat format) {
    std::vector<kernels::Weight> ws;
    ws.push_back(kernels::make_weight(src, kernels::SourceType::f32, rows, cols, format, ledger,
                                      tiering::accounts::scratch));
    const uint64_t each = std::max<uint64_t>(kernels::weight_bytes(ws.front().view), 1);
    ws.reserve(size_t((stream_bytes + each - 1) / each) + 1);  // `first` must stay put while copies are added
    const kernels::Weight& first = ws.front();
    for (uint64_t total = each; total < stream_bytes; total += each) {
      kernels::Weight w;
      w.view = first.view;
      auto copy = [&](const tiering::LedgerBuffer& from, tiering::LedgerBuffer& to, const void*& pointer) {
        if (from.empty()) return;
        to = tiering::LedgerBuffer(ledger, tiering::accounts::scratch, from.size());
        std::memcpy(to.data(), from.data(), from.size());
        pointer = static_cast<const char*>(to.data()) + (static_cast<const char*>(pointer) - static_cast<const char*>(from.data()));
      };
      copy(first.data, w.data, w.view.data);
      copy(first.scales, w.scales, w.view.scales);
      copy(first.biases, w.biases, w.view.biases);
      ws.push_back(std::move(w));
    }
    return ws;
  };
  std::vector<kernels::Weight> q8 = copies_of(kernels::WeightFormat::q8_0);
  std::vector<kernels::Weight> q4 = copies_of(kernels::WeightFormat::q4);
  source.reset();
  tiering::LedgerBuffer vectors(ledger, tiering::accounts::scratch, size_t(rows + cols) * sizeof(float));
  float* x = vectors.as<float>();
  float* y = x + cols;
  std::fill(x, x + cols, 0.5f);
  ++done;
  progress();

  // Prefill's GEMM: square SGEMM, 2n^3 flops.
  const int n = options.quick ? 512 : 1024;
  tiering::LedgerBuffer gemm(ledger, tiering::accounts::scratch, size_t(3) * n * n * sizeof(float));
  float* a = gemm.as<float>();
  float* b = a + size_t(n) * n;
  float* cm = b + size_t(n) * n;
  for (size_t i = 0; i < size_t(n) * n * 2; ++i) a[i] = float(i % 17) * 0.0625f;
  const int blas_threads = openblas_get_num_threads();

  std::vector<ComputeSample> result;
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
    auto matvec_gbs = [&](const std::vector<kernels::Weight>& ws) {
      double bytes = 0;
      for (auto& w : ws) bytes += double(kernels::weight_bytes(w.view));
      return best_rate(slice, bytes / 1e9, [&] {
        for (auto& w : ws) kernels::matvec(w.view, x, y, pool);
      });
    };
    s.matvec_q8_gbs = matvec_gbs(q8);
    ++done;
    progress();
    s.matvec_q4_gbs = matvec_gbs(q4);
    ++done;
    progress();
    result.push_back(s);
  }
  openblas_set_num_threads(blas_threads);
  return result;
}

}  // namespace tierlm::calibrate
