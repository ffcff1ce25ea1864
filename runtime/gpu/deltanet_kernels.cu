// runtime/gpu/deltanet_kernels.cu — the Gated DeltaNet mixer on the device (see deltanet_kernels.cuh), with the CPU's
// arithmetic (runtime/engine/gated_deltanet.cpp): the conv window in registers, a thread per channel; the recurrence a
// block per (segment, value head) with the head's state in shared memory for the whole segment, a thread per value
// dim (the state's column), the q/k l2 norms and RMSNormGated reduced over the block. Rows of a segment run in order,
// one at a time (exact, like the CPU's token-by-token form), so a chunk's result does not depend on the chunking.
#include <cmath>

#include "runtime/gpu/deltanet_kernels.cuh"
#include "runtime/gpu/device_launch.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

constexpr int kConvThreads = 128;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void __launch_bounds__(kConvThreads) deltanet_conv_kernel(const float* projected, const int32_t* segments,
                                                                      DeltaNetParams p, float* mixed) {
  kernel_entry();
  const int64_t s = blockIdx.x, c = int64_t(blockIdx.y) * kConvThreads + threadIdx.x;
  if (s >= segments[0] || c >= p.conv_dim) return;
  const int32_t* seg = segments + 1 + 4 * s;
  const int64_t first = seg[0], rows = seg[1], K = p.kernel, W = p.projected_width();
  float* window = p.state + int64_t(seg[2]) * p.slot_floats() + c * (K - 1);
  const float* weight = p.conv + c * K;
  float win[kDeltaNetMaxKernel - 1];
#pragma unroll
  for (int j = 0; j < kDeltaNetMaxKernel - 1; ++j) win[j] = j < K - 1 && !seg[3] ? window[j] : 0.0f;
  for (int64_t i = first; i < first + rows; ++i) {
    const float input = projected[i * W + c];
    float acc = weight[K - 1] * input;
#pragma unroll
    for (int j = 0; j < kDeltaNetMaxKernel - 1; ++j)
      if (j < K - 1) acc += weight[j] * win[j];
#pragma unroll
    for (int j = 0; j < kDeltaNetMaxKernel - 2; ++j)
      if (j < K - 2) win[j] = win[j + 1];
    if (K > 1) {
#pragma unroll
      for (int j = 0; j < kDeltaNetMaxKernel - 1; ++j)
        if (j == K - 2) win[j] = input;
    }
    mixed[i * p.conv_dim + c] = silu(acc);
  }
#pragma unroll
  for (int j = 0; j < kDeltaNetMaxKernel - 1; ++j)
    if (j < K - 1) window[j] = win[j];
}

// Dynamic shared memory: the head's state (dk x dv), the normalized q and k (dk each), 32 floats for reductions.
__global__ void deltanet_recurrence_kernel(const float* projected, const float* mixed, const int32_t* segments,
                                           DeltaNetParams p, float* core) {
  kernel_entry();
  extern __shared__ float shared[];
  const int64_t s = blockIdx.x, h = blockIdx.y;
  if (s >= segments[0]) return;  // (the whole block: no barrier is skipped by part of it)
  const int32_t* seg = segments + 1 + 4 * s;
  const int64_t first = seg[0], rows = seg[1];
  const int64_t dk = p.key_head_dim, dv = p.value_head_dim, C = p.conv_dim, Vd = p.value_dim();
  const int64_t nv = p.value_heads, kh = h / (nv / p.key_heads), W = p.projected_width();
  const int tid = threadIdx.x;
  float* S = shared;
  float* qs = S + dk * dv;
  float* ks = qs + dk;
  float* reduce = ks + dk;
  float* state = p.state + int64_t(seg[2]) * p.slot_floats() + p.conv_floats() + h * dk * dv;
  for (int64_t e = tid; e < dk * dv; e += blockDim.x) S[e] = seg[3] ? 0.0f : state[e];
  __syncthreads();
  const float q_scale = 1.0f / sqrtf(float(dk));
  for (int64_t i = first; i < first + rows; ++i) {
    const float* m = mixed + i * C;
    const float qa = tid < dk ? m[kh * dk + tid] : 0.0f;
    const float ka = tid < dk ? m[p.key_dim() + kh * dk + tid] : 0.0f;
    const float qq = block_total(qa * qa, reduce), kk = block_total(ka * ka, reduce);
    if (tid < dk) {
      qs[tid] = qa * (q_scale / sqrtf(qq + 1e-6f));
      ks[tid] = ka * (1.0f / sqrtf(kk + 1e-6f));
    }
    __syncthreads();
    const float* row = projected + i * W;
    const float beta = sigmoid(row[C + Vd + h]);
    const float decay = expf(p.decay_rate[h] * softplus(row[C + Vd + nv + h] + p.dt_bias[h]));
    float o = 0;
    if (tid < dv) {
      const int64_t j = tid;
      float acc = 0;
      for (int64_t a = 0; a < dk; ++a) {
        const float v = S[a * dv + j] * decay;
        S[a * dv + j] = v;
        acc += v * ks[a];
      }
      const float delta = (m[2 * p.key_dim() + h * dv + j] - acc) * beta;
      for (int64_t a = 0; a < dk; ++a) {
        const float v = S[a * dv + j] + ks[a] * delta;
        S[a * dv + j] = v;
        o += v * qs[a];
      }
    }
    // RMSNormGated: rms_norm(o) * w * silu(z) (the barrier inside also ends this row's reads of qs and ks).
    const float oo = block_total(o * o, reduce);
    if (tid < dv) {
      const float inv = float(1.0 / sqrt(double(oo) / double(dv) + double(p.eps)));
      core[i * Vd + h * dv + tid] = p.norm[tid] * (o * inv) * silu(row[C + h * dv + tid]);
    }
  }
  __syncthreads();
  for (int64_t e = tid; e < dk * dv; e += blockDim.x) state[e] = S[e];
}

}  // namespace

void deltanet_conv(const float* projected, int64_t max_segments, const int32_t* segments, const DeltaNetParams& p,
                   float* mixed, cudaStream_t stream) {
  if (max_segments <= 0) return;
  const dim3 grid(unsigned(max_segments), unsigned((p.conv_dim + kConvThreads - 1) / kConvThreads));
  launch(deltanet_conv_kernel, grid, kConvThreads, 0, stream, projected, segments, p, mixed);
}

void deltanet_recurrence(const float* projected, const float* mixed, int64_t max_segments, const int32_t* segments,
                         const DeltaNetParams& p, float* core, cudaStream_t stream) {
  if (max_segments <= 0) return;
  const int64_t widest = p.key_head_dim > p.value_head_dim ? p.key_head_dim : p.value_head_dim;
  const unsigned threads = unsigned((widest + 31) / 32 * 32);
  const size_t shared = size_t(p.key_head_dim * p.value_head_dim + 2 * p.key_head_dim + 32) * sizeof(float);
  launch(deltanet_recurrence_kernel, dim3(unsigned(max_segments), unsigned(p.value_heads)), threads, shared, stream,
         projected, mixed, segments, p, core);
}

}  // namespace tierlm::gpu::device
