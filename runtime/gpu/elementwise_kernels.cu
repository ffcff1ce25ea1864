// runtime/gpu/elementwise_kernels.cu — per-element kernels of the newer layer kinds: row biases (llama
// attention_bias / mlp_bias, gpt-oss's o_proj and expert biases), gpt-oss's clamped SwiGLU and qwen3_5's attention
// output gate, with the CPU's arithmetic (runtime/engine/forward.cpp add_residual, split_query_gate and the output
// gate, runtime/engine/ops.cpp clamped_swiglu_interleaved).
#include "runtime/gpu/device_kernels.cuh"
#include "runtime/gpu/device_launch.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

__global__ void add_bias_rows_kernel(float* y, int64_t rows, int64_t width, int64_t ldy, const float* bias) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  y[(i / width) * ldy + i % width] += bias[i % width];
}

__global__ void clamped_swiglu_kernel(const float* gu, int64_t rows, int64_t inter, float* out) {
  kernel_entry();
  constexpr float kLimit = 7.0f, kAlpha = 1.702f;  // hard-coded in GptOssExperts
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, j = i % inter;
  const float gate = fminf(gu[r * 2 * inter + 2 * j], kLimit);
  const float up = fminf(fmaxf(gu[r * 2 * inter + 2 * j + 1], -kLimit), kLimit);
  out[i] = (up + 1.0f) * (gate * (1.0f / (1.0f + expf(-gate * kAlpha))));
}

unsigned blocks_of(int64_t count) { return unsigned((count + 255) / 256); }

__global__ void split_query_gate_kernel(const float* from, int64_t rows, int64_t heads, int64_t kv_heads,
                                        int64_t hd, float* qkv, float* gate) {
  kernel_entry();
  const int64_t q_rows = heads * hd, width = q_rows + 2 * kv_heads * hd;  // a row of qkv
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * (width + q_rows)) return;
  const int64_t r = i / (width + q_rows), j = i % (width + q_rows);
  const float* row = from + r * (width + q_rows);
  if (j < q_rows) {  // query element j: head j / hd at [2 h hd, 2 h hd + hd) of the row
    qkv[r * width + j] = row[(j / hd) * 2 * hd + j % hd];
  } else if (j < width) {  // keys and values after the interleaved queries and gates
    qkv[r * width + j] = row[q_rows + j];
  } else {  // gate element j - width
    const int64_t g = j - width;
    gate[r * q_rows + g] = row[(g / hd) * 2 * hd + hd + g % hd];
  }
}

__global__ void sigmoid_gate_kernel(float* out, const float* gate, int64_t count) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

}  // namespace

void split_query_gate(const float* from, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, float* qkv,
                      float* gate, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t total = rows * (2 * heads + 2 * kv_heads) * head_dim;
  launch(split_query_gate_kernel, blocks_of(total), 256, 0, stream, from, rows, heads, kv_heads, head_dim, qkv, gate);
}

void sigmoid_gate(float* out, const float* gate, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  launch(sigmoid_gate_kernel, blocks_of(count), 256, 0, stream, out, gate, count);
}

void add_bias_rows(float* y, int64_t rows, int64_t width, int64_t ldy, const float* bias, cudaStream_t stream) {
  if (rows <= 0 || width <= 0 || !bias) return;
  launch(add_bias_rows_kernel, blocks_of(rows * width), 256, 0, stream, y, rows, width, ldy, bias);
}

void clamped_swiglu(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream) {
  if (rows <= 0) return;
  launch(clamped_swiglu_kernel, blocks_of(rows * intermediate), 256, 0, stream, gate_up, rows, intermediate, out);
}

}  // namespace tierlm::gpu::device
