// runtime/kernels/matmul_scratch.h — the working memory matvec / matmul need beside their inputs and outputs: the
// activations quantized to int8 (values, block scales, block integer sums, block sums, row pointers), MXFP4's
// even/odd split of the activations, MLX's per-group activation sums, the f32 tile of a dense matrix multiplied
// without a GEMM kernel, and the bf16 copy of the activations the AMX prefill GEMM multiplies. Which regions a
// multiplication takes, and how much, is matmul_scratch_sizes (weights.h): the dispatch's own rule.
// Owns: that memory, region by region, each charged to a ledger's "scratch" account before it exists (growing past
// the budget throws LedgerError). MatmulScratch::Scope makes one the calling thread's (Forward does for its steps,
// having reserved what its weights need at max_chunk rows); a thread without a scope uses a scratch of its own
// charged to a private unlimited ledger (tools, benches, probes), which is what every multiplication did before.
// Never: be used by two threads at once; shrink (regions keep their largest size until destroyed).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "tiering/ledger.h"

namespace tierlm::kernels {

class MatmulScratch {
 public:
  enum Region : int { act_values, act_scales, act_int_sums, act_sums, act_rows, mxfp4_split, group_sums, dense_tile,
                      act_bf16, kRegions };
  using Sizes = std::array<size_t, kRegions>;  // bytes per region

  explicit MatmulScratch(tiering::Ledger& ledger) : ledger_(&ledger) {}
  MatmulScratch(const MatmulScratch&) = delete;
  MatmulScratch& operator=(const MatmulScratch&) = delete;

  // At least `bytes` of region r, 64-byte aligned; grows (charging the ledger) only when it holds less.
  void* region(Region r, size_t bytes);
  // Grows every region to at least `sizes` (what later multiplications will take, so they allocate nothing).
  void reserve(const Sizes& sizes);
  // Bytes held over all regions (what the ledger is charged).
  uint64_t bytes() const;

  // The scratch the calling thread's multiplications use: the innermost live Scope's, else the thread's own.
  static MatmulScratch& current();

  class Scope {
   public:
    explicit Scope(MatmulScratch& scratch);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    MatmulScratch* previous_;
  };

 private:
  tiering::Ledger* ledger_;
  std::array<tiering::LedgerBuffer, kRegions> regions_;
};

}  // namespace tierlm::kernels
