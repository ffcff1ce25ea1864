// runtime/gpu/deltanet_kernels.cuh — internal: launchers of the Gated DeltaNet mixer's kernels (deltanet_kernels.cu),
// in plain types so gpu_layers.cpp compiles with the host compiler. The same recurrence as the CPU's
// engine::GatedDeltaNet (runtime/engine/gated_deltanet.h), token by token in f32, so a chunked prefill, a whole
// prefill and decode leave the same state:
//   mixed = silu(causal depthwise conv1d over the qkv channels of the projection, the last K-1 inputs kept in the
//   conv state); per value head h (key head h / (value_heads / key_heads)): q, k l2-normalized (q times
//   1/sqrt(key_head_dim)), beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias)),
//   S *= decay; delta = (v - Sᵀk) * beta; S += k deltaᵀ; o = Sᵀq; core = rms_norm(o) * norm * silu(z).
// State: a pool of slots per layer, slot_floats floats each: [conv (conv_dim x (kernel-1)) | recurrent (value_heads x
// key_head_dim x value_head_dim)], owned by gpu_layers.cpp. Segments: the step's runs of consecutive rows of one
// sequence, as int32 [count, then per segment: first row, rows, slot, clear (1: the segment starts at position 0,
// its state is zeroed first)], read from device memory so that a captured decode graph replays with new ones.
// Every launcher enqueues on `stream` and returns; none allocates or synchronizes. Never: included outside
// runtime/gpu.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tierlm::gpu::device {

struct DeltaNetParams {
  int64_t conv_dim = 0, kernel = 0, key_heads = 0, value_heads = 0, key_head_dim = 0, value_head_dim = 0;
  float eps = 1e-6f;                 // RMSNormGated's (rms_norm_eps)
  const float* conv = nullptr;       // conv_dim x kernel: conv[c * kernel + j] weighs input t - (kernel - 1) + j
  const float* decay_rate = nullptr; // value_heads: -exp(A_log)
  const float* dt_bias = nullptr;    // value_heads
  const float* norm = nullptr;       // value_head_dim: RMSNormGated's weight
  float* state = nullptr;            // the layer's slots
  __host__ __device__ int64_t key_dim() const { return key_heads * key_head_dim; }
  __host__ __device__ int64_t value_dim() const { return value_heads * value_head_dim; }
  __host__ __device__ int64_t conv_floats() const { return conv_dim * (kernel - 1); }
  __host__ __device__ int64_t slot_floats() const {
    return conv_floats() + value_heads * key_head_dim * value_head_dim;
  }
  // One projected row: [qkv (conv_dim) | z (value_dim) | b (value_heads) | a (value_heads)].
  __host__ __device__ int64_t projected_width() const { return conv_dim + value_dim() + 2 * value_heads; }
};

constexpr int64_t kDeltaNetMaxKernel = 8;       // conv taps held in registers
constexpr int64_t kDeltaNetMaxHeadDim = 1024;   // key / value head dims (a thread each)
// The recurrence keeps a value head's state (key_head_dim x value_head_dim f32) in shared memory.
constexpr int64_t kDeltaNetMaxStateBytes = 160 << 10;
inline int64_t deltanet_segment_ints(int64_t max_segments) { return 1 + 4 * max_segments; }

// mixed (rows x conv_dim) = silu(conv1d) of the projection's qkv channels (projected: rows x projected_width()),
// each segment's conv window carried through its rows and left in its slot. max_segments: a bound on the count
// (the launch's grid; the count itself is read from `segments`).
void deltanet_conv(const float* projected, int64_t max_segments, const int32_t* segments, const DeltaNetParams& p,
                   float* mixed, cudaStream_t stream);
// core (rows x value_dim) = the gated delta rule and RMSNormGated per row and value head, each segment's recurrent
// state carried through its rows (in order) and left in its slot.
void deltanet_recurrence(const float* projected, const float* mixed, int64_t max_segments, const int32_t* segments,
                         const DeltaNetParams& p, float* core, cudaStream_t stream);

}  // namespace tierlm::gpu::device
