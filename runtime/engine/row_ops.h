// runtime/engine/row_ops.h — the few helpers every engine unit (Forward, MoeBlock, MlaAttention) uses on rows of
// activations: a weight applied to n rows (matvec for one, matmul for several, so a weight is read once per step),
// a dot product the compiler vectorizes without reassociation flags, and scratch floats charged to the ledger.
// Never: allocate outside the ledger, or hold state.
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/thread_pool.h"
#include "runtime/kernels/weights.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

// y (n x w.rows) = x (n x w.cols) · wᵀ.
inline void multiply(const kernels::WeightView& w, const float* x, int64_t n, float* y, kernels::ThreadPool& pool) {
  if (n == 1)
    kernels::matvec(w, x, y, pool);
  else
    kernels::matmul(w, x, n, y, pool);
}

// Independent partial sums, so the loop vectorizes.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// At least one float of scratch (account "scratch").
inline tiering::LedgerBuffer scratch_floats(tiering::Ledger& ledger, int64_t n) {
  return tiering::LedgerBuffer(ledger, tiering::accounts::scratch, size_t(std::max<int64_t>(n, 1)) * sizeof(float));
}

}  // namespace tierlm::engine
