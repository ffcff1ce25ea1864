// runtime/gpu/dequant_ahead.h — internal to runtime/gpu: dequantization of a prefill step's packed weights ahead
// of their GEMMs, on a stream of its own. cuBLAS multiplies f16 copies of packed (q8_0, q4, MLX) weights; made on
// the compute stream, each copy's write and read sit between the GEMMs, and a quantized prefill took ~1.4x an f16
// one (H100, 180 tokens). Here the copies are made up to as many pieces ahead as there are f16 slots (a ring), while
// the compute stream runs the GEMMs and the kernels between them (attention, norms, RoPE, SiLU), which leave HBM and
// most SMs idle; events order each slot's write after its last GEMM and each GEMM after its slot's write.
// Owns: the side stream (lowest priority) and the events. The slots' memory belongs to the caller (charged to its
// ledger). Never: used by more than one thread, or with a slot the caller also writes during a step (begin..end).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "runtime/gpu/device_kernels.cuh"

namespace tierlm::gpu {

class DequantAhead {
 public:
  // Rows [r0, r0 + rows) of a weight, as one GEMM reads them.
  struct Piece {
    device::MatrixRef matrix;
    int64_t r0 = 0, rows = 0;
  };
  // slots: at least 2 device buffers of slot_elements f16 each.
  DequantAhead(std::vector<void*> slots, int64_t slot_elements);
  ~DequantAhead();
  DequantAhead(const DequantAhead&) = delete;
  DequantAhead& operator=(const DequantAhead&) = delete;

  int64_t slot_elements() const { return slot_elements_; }
  // A step's pieces in the order its GEMMs take them (each rows * cols <= slot_elements). The compute stream must
  // be idle when a step begins (the slots' last readers are done).
  void begin(std::vector<Piece> pieces);
  // True between begin() and end() while pieces remain.
  bool active() const { return next_use_ < pieces_.size(); }
  // The f16 copy of the next piece, which must be (matrix, r0, rows) (std::logic_error otherwise): `compute` waits
  // for it. Call consumed(compute) once the GEMM reading it is enqueued.
  const void* take(const device::MatrixRef& matrix, int64_t r0, int64_t rows, cudaStream_t compute);
  void consumed(cudaStream_t compute);
  // Drops what remains of the plan (an exception mid-step); the side stream finishes what it was given.
  void end();

 private:
  void issue();

  std::vector<void*> slots_;
  int64_t slot_elements_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> ready_, free_;
  std::vector<Piece> pieces_;
  size_t next_use_ = 0, next_issue_ = 0;
};

}  // namespace tierlm::gpu
