// runtime/gpu/cublas_loader.h — internal: cuBLAS opened with dlopen on first use instead of linked. Linking
// libcublas costs ~150 MB of resident memory at process start (its relocations and initializers) even in a run that
// never touches a GPU, which would break the small-memory budgets this runtime exists for; the CUDA runtime itself
// is linked statically and costs nothing until called. Only the four entry points the backend uses are resolved,
// each with the type of its C declaration in cublas_v2.h. Never: included outside runtime/gpu.
#pragma once

#ifdef TIERLM_HAVE_CUDA

#include <string>

#include <cublas_v2.h>

namespace tierlm::gpu {

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // The C symbol (C++ also sees an overload taking cudaDataType as the compute type, so no decltype here).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// The library, opened once (thread-safe); null when it cannot be loaded, and then cublas_error() says why.
const Cublas* cublas();
std::string cublas_error();

}  // namespace tierlm::gpu

#endif
