// runtime/gpu/gemma4_kernels.cu — Gemma 4's own kernels (see gemma4_kernels.cuh), each the CPU's arithmetic in f32:
// norms as engine::rms_norm (sum of squares, then x * inv times the weight), RoPE as engine::Rope::apply, GeGLU as
// engine::gelu_tanh_gate, soft-capping as engine::soft_cap.
#include "runtime/gpu/device_launch.cuh"
#include "runtime/gpu/gemma4_kernels.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

constexpr int kMaxHeadDim = 256;  // check_supported refuses wider heads

unsigned blocks_of(int64_t count) { return unsigned((count + 255) / 256); }

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi), as torch's tanh approximation
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// One warp per (row, head slot): slots [0, heads) the queries, then kv_heads keys and kv_heads values (own KV).
__global__ void gemma4_qkv_kernel(const float* proj, int64_t ld_proj, Gemma4QkvParams p, const int32_t* positions,
                                  float* qkv) {
  kernel_entry();
  __shared__ float v[kMaxHeadDim];
  const int64_t slots = p.heads + (p.own_kv ? 2 * p.kv_heads : 0);
  const int64_t row = blockIdx.x / slots, slot = blockIdx.x % slots, hd = p.head_dim;
  const int lane = threadIdx.x;
  const int64_t q_rows = p.heads * hd, kv_rows = p.kv_heads * hd;
  const float* in = proj + row * ld_proj;
  float* out = qkv + row * (q_rows + 2 * kv_rows);
  const bool query = slot < p.heads, key = !query && slot < p.heads + p.kv_heads;
  const int64_t head = query ? slot : key ? slot - p.heads : slot - p.heads - p.kv_heads;
  const float* src = query ? in + head * hd
                     : key ? in + q_rows + head * hd
                           : in + q_rows + (p.k_eq_v ? 0 : kv_rows) + head * hd;
  float* dst = query ? out + head * hd : key ? out + q_rows + head * hd : out + q_rows + kv_rows + head * hd;
  float squares = 0;
  for (int64_t j = lane; j < hd; j += 32) {
    const float x = src[j];
    v[j] = x;
    squares += x * x;
  }
  const float inv = rsqrtf(warp_total(squares) / float(hd) + p.eps);
  const float* weight = query ? p.q_norm : key ? p.k_norm : nullptr;  // v_norm: no weight
  for (int64_t j = lane; j < hd; j += 32) v[j] = weight ? weight[j] * (v[j] * inv) : v[j] * inv;
  __syncwarp();
  if (query || key) {
    const int32_t pos = positions[row];
    const int64_t half = (p.rotary_dim > 0 ? p.rotary_dim : hd) / 2;
    for (int64_t j = lane; j < half; j += 32) {
      float s, c;
      sincosf(float(pos) * p.inv_freq[j], &s, &c);
      const float a = v[j], b = v[j + half];
      v[j] = a * c - b * s;
      v[j + half] = b * c + a * s;
    }
    __syncwarp();
  }
  const float scale = query ? p.q_scale : 1.0f;
  for (int64_t j = lane; j < hd; j += 32) dst[j] = scale != 1.0f ? v[j] * scale : v[j];
}

// rsqrt(mean(x^2) + eps) over a row of `width` floats; every thread of the block gets it (shared: 32 floats).
__device__ __forceinline__ float row_inv_rms(const float* xr, int64_t width, float eps, float* shared) {
  float s = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) s += xr[i] * xr[i];
  s = block_total(s, shared);
  return rsqrtf(s / float(width) + eps);
}

// One block per row.
__global__ void rms_norm_add_kernel(const float* x, int64_t ldx, const float* weight, int64_t width, float eps,
                                    float* y, int64_t ldy) {
  kernel_entry();
  __shared__ float shared[32];
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  float* yr = y + int64_t(blockIdx.x) * ldy;
  const float inv = row_inv_rms(xr, width, eps, shared);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] += weight[i] * (xr[i] * inv);
}

__global__ void router_input_kernel(const float* x, int64_t width, const float* scale, float root, float eps,
                                    float* out) {
  kernel_entry();
  __shared__ float shared[32];
  const float* xr = x + int64_t(blockIdx.x) * width;
  float* o = out + int64_t(blockIdx.x) * width;
  const float inv = row_inv_rms(xr, width, eps, shared);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = (xr[i] * inv) * scale[i] * root;
}

__global__ void gelu_gate_kernel(const float* gu, int64_t rows, int64_t inter, float* out) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, j = i % inter;
  out[i] = gelu_tanh(gu[r * 2 * inter + j]) * gu[r * 2 * inter + inter + j];
}

__global__ void gelu_times_kernel(float* gate, int64_t rows, int64_t width, const float* inputs, int64_t ld) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  gate[i] = gelu_tanh(gate[i]) * inputs[(i / width) * ld + i % width];
}

__global__ void scale_kernel(float* x, int64_t count, float s) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] *= s;
}

__global__ void soft_cap_kernel(float* x, int64_t count, float cap) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = tanhf(x[i] / cap) * cap;
}

}  // namespace

void gemma4_qkv(const float* proj, int64_t ld_proj, int64_t rows, const Gemma4QkvParams& p, const int32_t* positions,
                float* qkv, cudaStream_t stream) {
  const int64_t slots = p.heads + (p.own_kv ? 2 * p.kv_heads : 0);
  if (rows > 0) launch(gemma4_qkv_kernel, unsigned(rows * slots), 32, 0, stream, proj, ld_proj, p, positions, qkv);
}

void rms_norm_add(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t width, float eps, float* y,
                  int64_t ldy, cudaStream_t stream) {
  if (rows > 0) launch(rms_norm_add_kernel, unsigned(rows), 256, 0, stream, x, ldx, weight, width, eps, y, ldy);
}

void gelu_gate(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream) {
  if (rows > 0)
    launch(gelu_gate_kernel, blocks_of(rows * intermediate), 256, 0, stream, gate_up, rows, intermediate, out);
}

void gelu_times(float* gate, int64_t rows, int64_t width, const float* inputs, int64_t ld_inputs, cudaStream_t stream) {
  if (rows > 0)
    launch(gelu_times_kernel, blocks_of(rows * width), 256, 0, stream, gate, rows, width, inputs, ld_inputs);
}

void router_input(const float* x, int64_t rows, int64_t width, const float* scale, float root, float eps, float* out,
                  cudaStream_t stream) {
  if (rows > 0) launch(router_input_kernel, unsigned(rows), 256, 0, stream, x, width, scale, root, eps, out);
}

void scale(float* x, int64_t count, float s, cudaStream_t stream) {
  if (count > 0) launch(scale_kernel, blocks_of(count), 256, 0, stream, x, count, s);
}

void soft_cap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count > 0) launch(soft_cap_kernel, blocks_of(count), 256, 0, stream, x, count, cap);
}

}  // namespace tierlm::gpu::device
