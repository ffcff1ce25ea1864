// runtime/gpu/split_f16.cu — f32 activations as hi + lo f16 parts (see split_f16.cuh).
#include <cuda_fp16.h>

#include "runtime/gpu/device_launch.cuh"
#include "runtime/gpu/split_f16.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

__global__ void to_f16_split_kernel(const float* x, int64_t count, __half* hi, __half* lo) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float v = x[i];
  const __half h = __float2half_rn(v);
  hi[i] = h;
  lo[i] = __float2half_rn((v - __half2float(h)) * kSplitLowScale);
}

}  // namespace

void to_f16_split(const float* x, int64_t count, void* hi, void* lo, cudaStream_t stream) {
  if (count <= 0) return;
  launch(to_f16_split_kernel, unsigned((count + 255) / 256), 256, 0, stream, x, count, static_cast<__half*>(hi),
         static_cast<__half*>(lo));
}

}  // namespace tierlm::gpu::device
