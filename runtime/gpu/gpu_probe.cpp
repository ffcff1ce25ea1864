// runtime/gpu/gpu_probe.cpp — GPU probes for calibration (see gpu_probe.h). Each probe warms up once, then times
// several repetitions with CUDA events and keeps the best (the steady-state rate a plan can count on).
#include "runtime/gpu/gpu_probe.h"

#ifdef TIERLM_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <cuda_runtime.h>

#include "runtime/gpu/cublas_loader.h"
#include "runtime/gpu/device_kernels.cuh"

namespace tierlm::gpu {

namespace {

// Best time in seconds of `reps` runs of fn (enqueued on the default stream) after one warm-up.
template <class Fn>
double best_seconds(Fn&& fn, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();
  cudaDeviceSynchronize();
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(best) / 1e3;
}

// Captures enqueue() (which launches `launches` kernels on `stream`) into a CUDA graph and replays it: the best
// device microseconds per launch over 10 replays after 2 warm-ups.
template <class Enqueue>
double graph_us_per_launch(cudaStream_t stream, int launches, Enqueue&& enqueue) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  enqueue();
  cudaStreamEndCapture(stream, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e30f;
  for (int rep = 0; rep < 12; ++rep) {
    cudaEventRecord(a, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (rep > 1) best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  return 1e3 * double(best) / launches;
}

}  // namespace

std::string gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  if (count == 0) return "no CUDA device: none visible";
  if (!cublas()) return cublas_error();
  return "";
}

bool gpu_available() { return gpu_unavailable_reason().empty(); }

std::optional<GpuProbe> probe_gpu(bool quick) {
  if (!gpu_available()) return std::nullopt;
  GpuProbe p;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return std::nullopt;
  p.name = prop.name;
  p.compute_capability = prop.major * 10 + prop.minor;
  p.multiprocessors = prop.multiProcessorCount;
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  p.free_bytes = free_bytes;
  p.total_bytes = total;

  const size_t copy_bytes = quick ? (64ull << 20) : (1ull << 30);
  void *a = nullptr, *b = nullptr, *host = nullptr;
  if (cudaMalloc(&a, copy_bytes) != cudaSuccess || cudaMalloc(&b, copy_bytes) != cudaSuccess) {
    cudaFree(a);
    cudaGetLastError();
    return p;  // memory known, rates not measured
  }
  cudaMemset(a, 1, copy_bytes);
  const size_t h2d_bytes = quick ? (32ull << 20) : (256ull << 20);
  if (cudaMallocHost(&host, h2d_bytes) == cudaSuccess) {
    std::fill_n(static_cast<char*>(host), h2d_bytes, char(3));
    const double s = best_seconds([&] { cudaMemcpyAsync(a, host, h2d_bytes, cudaMemcpyHostToDevice); }, 5);
    p.h2d_pinned_bytes_per_second = double(h2d_bytes) / s;
    cudaFreeHost(host);
  }
  // Device copy: bytes read plus bytes written, the traffic a decode step's weight reads are compared with.
  const double s = best_seconds([&] { cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice); }, 10);
  p.d2d_bytes_per_second = 2.0 * double(copy_bytes) / s;
  cudaFree(b);

  // f16 GEMM through cuBLAS (f32 accumulation), on non-zero data.
  const int dim = quick ? 1024 : 4096;
  const size_t elems = size_t(dim) * dim;
  if (3 * elems * 2 + elems * 4 <= copy_bytes) {
    char* base = static_cast<char*>(a);
    std::vector<uint16_t> values(2 * elems);  // f16 in +-[0.5, 1): random signs and mantissas
    uint32_t state = 12345;
    for (uint16_t& v : values) {
      state = state * 1664525u + 1013904223u;
      v = uint16_t(0x3800u | ((state >> 8) & 0x3ffu) | ((state >> 31) << 15));
    }
    cudaMemcpy(base, values.data(), values.size() * 2, cudaMemcpyHostToDevice);
    const Cublas& api = *cublas();  // gpu_available() checked it loads
    cublasHandle_t blas;
    if (api.create(&blas) == CUBLAS_STATUS_SUCCESS) {
      const float alpha = 1.0f, beta = 0.0f;
      void* A = base;
      void* B = base + elems * 2;
      void* C = base + elems * 4;
      const double g = best_seconds(
          [&] {
            api.gemm_ex(blas, CUBLAS_OP_N, CUBLAS_OP_N, dim, dim, dim, &alpha, A, CUDA_R_16F, dim, B, CUDA_R_16F,
                         dim, &beta, C, CUDA_R_32F, dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          },
          5);
      p.gemm_f16_flops = 2.0 * double(dim) * dim * dim / g;
      api.destroy(blas);
    }
  }
  cudaFree(a);
  cudaGetLastError();
  return p;
}

std::optional<KernelChainProbe> probe_kernel_chain(int64_t rows, int64_t cols, int count, int mode, int format,
                                                   bool packed_mma) {
  if (!gpu_available() || rows <= 0 || cols <= 0 || cols % 32 != 0 || count <= 0) return std::nullopt;
  if (format != 1 && format != 2 && format != 3 && format != 4) return std::nullopt;
  KernelChainProbe r;
  r.rows = rows;
  r.cols = cols;
  // Packed formats: 16-row panels, f16 scales (and biases for q4) per group of 32, as kernels::make_weight lays out.
  const bool packed = format >= 3;
  const int bits = format == 3 ? 8 : format == 4 ? 4 : 16;
  const int64_t padded = packed ? (rows + 15) / 16 * 16 : rows;
  const size_t data = size_t(padded * cols) * size_t(bits) / 8;
  const size_t scales = packed ? size_t(padded * (cols / 32)) * 2 : 0, biases = format == 4 ? scales : 0;
  const size_t matrix = (data + scales + biases + 255) / 256 * 256;
  r.bytes = double(data + scales + biases);
  char* weights = nullptr;
  float *x = nullptr, *y = nullptr;
  if (cudaMalloc(&weights, matrix * size_t(count)) != cudaSuccess || cudaMalloc(&x, size_t(cols) * 8) != cudaSuccess ||
      cudaMalloc(&y, size_t(rows) * 4 * size_t(count)) != cudaSuccess) {
    cudaFree(weights);
    cudaFree(x);
    cudaGetLastError();
    return std::nullopt;
  }
  cudaMemset(weights, 0x3c, matrix * size_t(count));  // bf16 0x3c3c: about 0.0115; f16 scales: about 1.06
  cudaMemset(x, 0, size_t(cols) * 8);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  device::set_packed_mma(packed_mma, true);
  for (bool programmatic : {false, true}) {
    device::set_programmatic_launch(programmatic);
    (programmatic ? r.programmatic_us : r.plain_us) = graph_us_per_launch(stream, count, [&] {
      for (int i = 0; i < count; ++i) {
        device::MatrixRef m;
        m.format = format;
        m.rows = rows;
        m.cols = cols;
        m.data = weights + matrix * size_t(i);
        if (packed) {
          m.scales = weights + matrix * size_t(i) + data;
          m.biases = format == 4 ? weights + matrix * size_t(i) + data + scales : nullptr;
          m.scale_type = 1;
          m.group_size = 32;
          m.bits = bits;
        }
        if (mode == 1)
          device::matvec_normed(m, x, x, 1e-6f, y + rows * i, false, stream);
        else if (mode == 2)
          device::matvec_gated(m, x, y + rows * i, false, stream);
        else
          device::matvec(m, x, cols, 1, y + rows * i, rows, false, stream);
      }
    });
  }
  device::set_programmatic_launch(true);
  device::set_packed_mma(true, false);
  cudaStreamDestroy(stream);
  cudaFree(weights);
  cudaFree(x);
  cudaFree(y);
  cudaGetLastError();
  return r;
}

std::optional<double> probe_attention(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t len, bool fused,
                                      int skip_mask) {
  if (!gpu_available() || len <= 0) return std::nullopt;
  const int64_t pages = (len + device::kKvPage - 1) / device::kKvPage, stride = (heads + 2 * kv_heads) * head_dim;
  const size_t kv_bytes = size_t(pages * device::kKvPage * kv_heads * head_dim) * 2;
  device::QkvParams shape{};
  shape.heads = heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  const size_t partial_floats = size_t(device::attention_scratch_floats(1, shape, len));
  std::vector<void*> buffers;
  auto alloc = [&](size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 256)) != cudaSuccess) return static_cast<void*>(nullptr);
    cudaMemset(p, 0, std::max<size_t>(bytes, 256));
    buffers.push_back(p);
    return p;
  };
  auto* keys = alloc(kv_bytes);
  auto* values = alloc(kv_bytes);
  auto* qkv = static_cast<float*>(alloc(size_t(stride) * 4));
  auto* partial = static_cast<float*>(alloc(partial_floats * 4));
  auto* out = static_cast<float*>(alloc(size_t(heads * head_dim) * 4));
  auto* arrivals = static_cast<int32_t*>(alloc(size_t(kv_heads) * 4));
  auto* inv_freq = static_cast<float*>(alloc(size_t(head_dim / 2) * 4));
  auto* ints = static_cast<int32_t*>(alloc(size_t(2 + pages) * 4));  // position, sequence of the row, page table
  std::optional<double> result;
  if (keys && values && qkv && partial && out && arrivals && inv_freq && ints) {
    std::vector<int32_t> host(size_t(2 + pages));
    host[0] = int32_t(len - 1);
    host[1] = 0;
    for (int64_t i = 0; i < pages; ++i) host[size_t(2 + i)] = int32_t(i);
    cudaMemcpy(ints, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
    std::vector<float> freq(size_t(head_dim / 2));
    for (size_t i = 0; i < freq.size(); ++i) freq[i] = std::pow(10000.0f, -2.0f * float(i) / float(head_dim));
    cudaMemcpy(inv_freq, freq.data(), freq.size() * 4, cudaMemcpyHostToDevice);
    shape.inv_freq = inv_freq;
    shape.eps = 1e-6f;
    device::KvRef kv;
    kv.keys = keys;
    kv.values = values;
    const device::PageTables tables{ints + 2, pages, ints + 1};
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    device::set_attention_debug(skip_mask);  // read when the launches are captured
    constexpr int kLaunches = 16;
    result = graph_us_per_launch(stream, kLaunches, [&] {
      for (int i = 0; i < kLaunches; ++i)
        device::attention(qkv, 1, shape, ints, kv, tables, len, fused, partial, arrivals, out, stream);
    });
    device::set_attention_debug(0);
    cudaStreamDestroy(stream);
  }
  for (void* p : buffers) cudaFree(p);
  cudaGetLastError();
  return result;
}

}  // namespace tierlm::gpu

#else

namespace tierlm::gpu {

bool gpu_available() { return false; }
std::string gpu_unavailable_reason() { return "built without CUDA (no CUDA toolkit was found at configure time)"; }
std::optional<GpuProbe> probe_gpu(bool) { return std::nullopt; }
std::optional<KernelChainProbe> probe_kernel_chain(int64_t, int64_t, int, int, int, bool) { return std::nullopt; }
std::optional<double> probe_attention(int64_t, int64_t, int64_t, int64_t, bool, int) { return std::nullopt; }

}  // namespace tierlm::gpu

#endif
