// runtime/gpu/cublas_loader.cpp — see cublas_loader.h. Search order: the soname of the toolkit this was built with
// (the dynamic loader's paths: LD_LIBRARY_PATH, the ld cache), then that toolkit's library folder, then the
// unversioned name.
#include "runtime/gpu/cublas_loader.h"

#ifdef TIERLM_HAVE_CUDA

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

namespace tierlm::gpu {

namespace {

#define TIERLM_STR2(x) #x
#define TIERLM_STR(x) TIERLM_STR2(x)

struct Loaded {
  Cublas api;
  bool ok = false;
  std::string error;
};

const Loaded& loaded() {
  static Loaded l;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublas.so." TIERLM_STR(CUBLAS_VER_MAJOR);
    std::string tried;
    void* h = nullptr;
    std::vector<std::string> candidates = {soname};
#ifdef TIERLM_CUDA_LIBRARY_DIR
    candidates.push_back(std::string(TIERLM_CUDA_LIBRARY_DIR) + "/" + soname);
#endif
    candidates.push_back("libcublas.so");
    for (const std::string& name : candidates) {
      h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h) break;
      const char* why = dlerror();
      tried += (tried.empty() ? "" : "; ") + std::string(why ? why : name);
    }
    if (!h) {
      l.error = "cuBLAS could not be loaded (" + tried + "); put the CUDA toolkit's lib64 on LD_LIBRARY_PATH";
      return;
    }
    auto sym = [&](const char* name) -> void* {
      void* p = dlsym(h, name);
      if (!p && l.error.empty()) l.error = std::string("cuBLAS has no symbol ") + name;
      return p;
    };
    l.api.create = reinterpret_cast<decltype(l.api.create)>(sym("cublasCreate_v2"));
    l.api.destroy = reinterpret_cast<decltype(l.api.destroy)>(sym("cublasDestroy_v2"));
    l.api.set_stream = reinterpret_cast<decltype(l.api.set_stream)>(sym("cublasSetStream_v2"));
    l.api.gemm_ex = reinterpret_cast<decltype(l.api.gemm_ex)>(sym("cublasGemmEx"));
    l.ok = l.error.empty();
  });
  return l;
}

}  // namespace

const Cublas* cublas() { return loaded().ok ? &loaded().api : nullptr; }
std::string cublas_error() { return loaded().error; }

}  // namespace tierlm::gpu

#endif
