// runtime/gpu/split_f16.cuh — internal: f32 activations as two f16 parts for the tensor-core GEMMs of
// GpuOptions::split_gemm_activations: hi = f16(x) and lo = f16((x - hi) * kSplitLowScale), so that
// W·x = W·hi + W·lo / kSplitLowScale (two GEMMs, f32 accumulation) keeps ~22 bits of each activation instead of
// f16's 11 (packed_decode.cu's decode matvec splits x the same way). The scale keeps lo out of f16's subnormals.
// Never: included outside runtime/gpu.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tierlm::gpu::device {

inline constexpr float kSplitLowScale = 2048.0f;
void to_f16_split(const float* x, int64_t count, void* hi, void* lo, cudaStream_t stream);

}  // namespace tierlm::gpu::device
