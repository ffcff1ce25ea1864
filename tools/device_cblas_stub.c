/* tools/device_cblas_stub.c — a plain cblas_sgemm and the thread-count calls (the OpenBLAS symbols tierlm uses),
   standing in for OpenBLAS in what tools/gpu_device_run.sh carries to the device with STUB_BLAS=1: OpenBLAS alone is
   ~4.3 MB of the carry after xz, and the checkout plus the carry must stay under 64 MiB. Correct but slow: only for
   GPU tests and benches, where the CPU does little (the exact-math oracle of small fixtures; the CPU layers of
   gpu_bench's split rows are slower with it). Never linked into the product. */
#include <stddef.h>
void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  if (order == 102) { /* column major: C^T = B^T A^T in row major */
    const float* t = A; A = B; B = t;
    int ti = lda; lda = ldb; ldb = ti;
    ti = ta; ta = tb; tb = ti;
    ti = M; M = N; N = ti;
  }
  for (int i = 0; i < M; ++i) {
    float* c = C + (size_t)i * ldc;
    for (int j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    for (int k = 0; k < K; ++k) {
      const float a = alpha * (ta == 111 ? A[(size_t)i * lda + k] : A[(size_t)k * lda + i]);
      if (tb == 111) {
        const float* b = B + (size_t)k * ldb;
        for (int j = 0; j < N; ++j) c[j] += a * b[j];
      } else {
        for (int j = 0; j < N; ++j) c[j] += a * B[(size_t)j * ldb + k];
      }
    }
  }
}

/* One thread: the stub's product is serial. */
static int threads = 1;
void openblas_set_num_threads(int n) { threads = n > 0 ? 1 : threads; }
int openblas_get_num_threads(void) { return threads; }
