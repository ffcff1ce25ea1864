// runtime/gpu/elementwise_kernels.cu — per-element kernels of the newer layer kinds: row biases (llama
// attention_bias / mlp_bias, gpt-oss's o_proj and expert biases) and gpt-oss's clamped SwiGLU, with the CPU's
// arithmetic (runtime/engine/forward.cpp add_residual, runtime/engine/ops.cpp clamped_swiglu_interleaved).
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

}  // namespace

void add_bias_rows(float* y, int64_t rows, int64_t width, int64_t ldy, const float* bias, cudaStream_t stream) {
  if (rows <= 0 || width <= 0 || !bias) return;
  launch(add_bias_rows_kernel, blocks_of(rows * width), 256, 0, stream, y, rows, width, ldy, bias);
}

void clamped_swiglu(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream) {
  if (rows <= 0) return;
  launch(clamped_swiglu_kernel, blocks_of(rows * intermediate), 256, 0, stream, gate_up, rows, intermediate, out);
}

}  // namespace tierlm::gpu::device
