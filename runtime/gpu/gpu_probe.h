// runtime/gpu/gpu_probe.h — what calibration needs to know about the GPU: its memory, the pinned host-to-device
// bandwidth, the device memory bandwidth (a device-to-device copy: the decode roofline) and the f16 GEMM rate.
// Owns: short timed probes on device 0 (a few hundred ms in all). Never: called on the decode path.
// Without a CUDA build or without a visible GPU, probe_gpu() returns nullopt and gpu_unavailable_reason() says why.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tierlm::gpu {

struct GpuProbe {
  std::string name;                    // e.g. "NVIDIA H100 80GB HBM3"
  int compute_capability = 0;          // 90 for Hopper
  int multiprocessors = 0;
  uint64_t total_bytes = 0;            // device memory
  uint64_t free_bytes = 0;             // free when probed
  double h2d_pinned_bytes_per_second = 0;  // pinned host -> device copy
  double d2d_bytes_per_second = 0;     // device copy, bytes read + written (the memory-bandwidth roofline)
  double gemm_f16_flops = 0;           // cuBLAS f16 x f16 -> f32 GEMM, 4096^3
};

// True when this binary has the CUDA backend and a GPU is visible.
bool gpu_available();
// Why gpu_available() is false ("" when it is true): "built without CUDA", "no CUDA device: ...".
std::string gpu_unavailable_reason();
// Measures device 0. `quick` shrinks the transfers (for tests). nullopt when !gpu_available().
std::optional<GpuProbe> probe_gpu(bool quick = false);

// A chain of `count` decode matvecs (rows x cols in `format`: 1 f16, 2 bf16, 3 q8_0, 4 q4 (kernels::WeightFormat
// codes), one x row, distinct matrices so nothing stays in L2)
// replayed as one CUDA graph: device microseconds per kernel with plain launches and with programmatic dependent
// launch, next to the time its bytes take at the d2d rate. What a decode step pays per kernel beyond streaming.
struct KernelChainProbe {
  int64_t rows = 0, cols = 0;
  double plain_us = 0, programmatic_us = 0;
  double bytes = 0;  // weight bytes per kernel
};
// mode 0: y = W x; 1: y = W rmsnorm(x) (the norm fused into the kernel); 2: y = W (silu(g) * u) (gate fused).
// packed_mma: packed formats (8- and 4-bit) on the tensor-core kernel (false: the CUDA-core one).
std::optional<KernelChainProbe> probe_kernel_chain(int64_t rows, int64_t cols, int count = 16, int mode = 0,
                                                   int format = 2, bool packed_mma = true);

// Decode attention (one row, f16 device KV of `len` positions, heads / kv_heads / head_dim) replayed 16 times as
// one CUDA graph: device microseconds per launch, fused (RoPE/KV store inside) or not, with phases skipped for
// diagnostics (device::set_attention_debug's mask). nullopt without a GPU.
std::optional<double> probe_attention(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t len, bool fused,
                                      int skip_mask = 0);

}  // namespace tierlm::gpu
