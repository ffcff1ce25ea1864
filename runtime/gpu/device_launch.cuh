// runtime/gpu/device_launch.cuh — internal to the .cu files of runtime/gpu: how every kernel is launched
// (programmatic dependent launch, see device_kernels.cuh), the griddepcontrol steps each kernel takes, the
// warp/block sums, and the K/V codec load the attention kernels share. Never: included by host-compiled code.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <unordered_map>
#include <utility>

#include "runtime/gpu/device_kernels.cuh"

namespace tierlm::gpu::device::detail {

inline bool g_programmatic = true;  // set_programmatic_launch

// A kernel may use more than 48 KiB of dynamic shared memory only once it says so; raised per kernel, only when a
// launch needs more than it was last allowed.
inline void allow_shared(const void* kernel, size_t bytes) {
  static std::unordered_map<const void*, size_t> allowed;
  size_t& now = allowed[kernel];
  if (bytes > now) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    now = bytes;
  }
}

// Launch with the programmatic-stream-serialization attribute (or plainly when switched off).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, unsigned block, size_t shared, cudaStream_t stream,
            Args&&... args) {
  if (shared > (size_t(48) << 10)) allow_shared(reinterpret_cast<const void*>(kernel), shared);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = g_programmatic ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Activation pointers are never __restrict__ in these kernels: with restrict, the compiler may treat what they point
// to as invariant for the whole kernel and hoist its loads above this wait (seen: the fused decode matvec read the
// previous layer's hidden state). The "memory" clobber then forces them to stay below.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Sum over a warp (every lane gets it).
__device__ __forceinline__ float warp_total(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (every thread gets it; blockDim.x a multiple of 32); `shared` holds a float per warp and is free
// again on return.
__device__ __forceinline__ float block_total(float v, float* shared) {
  v = warp_total(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  v = warp_total(v);
  __syncthreads();
  return v;
}

// Start of a kernel that has nothing to fetch early.
__device__ __forceinline__ void kernel_entry() {
  let_next_kernel_start();
  wait_for_previous_kernel();
}

// One thread's bulk prefetch of [p, p + bytes) into L2 (bytes a multiple of 16, p 16-byte aligned).
__device__ __forceinline__ void prefetch_l2_thread(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0 && bytes >= 16)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes & ~15u) : "memory");
#endif
}

// c += A B on the tensor cores (mma.m16n8k16, f16 in, f32 accumulation). Fragments (PTX ISA), with g = lane / 4
// and t = lane % 4: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8,
// 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g] (two halves a register, the lower index in the low half);
// c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1].
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Eight K/V elements of row `at` of `rows` (hd elements a row in the codec: f16, q8 codes with `scales`, hd /
// q8_block floats a row, or f32) starting at dim j (a multiple of 8), as floats. The pool and a block's staged copy of its
// chunk have this layout.
__device__ __forceinline__ void codec_load8(const void* rows, const float* scales, int codec, int64_t at, int64_t hd,
                                            int64_t j, float* out) {
  if (codec == 0) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(rows) + at * hd + j);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h[k]);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
    return;
  }
  if (codec == 2) {
    const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(rows) + at * hd + j);
    const float4 a = f[0], b = f[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    return;
  }
  const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(rows) + at * hd + j);
  const int8_t* c = reinterpret_cast<const int8_t*>(&raw);
  const int block = q8_block(hd);
  const float scale = scales[at * (hd / block) + j / block];
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = float(c[k]) * scale;
}

}  // namespace tierlm::gpu::device::detail
