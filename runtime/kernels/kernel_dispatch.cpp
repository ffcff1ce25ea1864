// runtime/kernels/kernel_dispatch.cpp — picks the kernel backend at run time from the CPU's features, with a
// process-wide override for tests and benchmarks.
#include <atomic>
#include <stdexcept>
#include <string>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

namespace {
std::atomic<int> g_forced{-1};
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

Isa detected_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Isa::avx2;
    return Isa::scalar;
  }();
  return isa;
}

Isa active_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced < 0 ? detected_isa() : static_cast<Isa>(forced);
}

void set_isa_for_testing(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa()))
    throw std::invalid_argument(std::string("set_isa_for_testing: this CPU cannot run ") + isa_name(isa) +
                                " kernels (best: " + isa_name(detected_isa()) + ")");
  g_forced.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const KernelTable& active_kernels() {
  switch (active_isa()) {
    case Isa::avx512: return avx512_kernels();
    case Isa::avx2: return avx2_kernels();
    case Isa::scalar: break;
  }
  return scalar_kernels();
}

}  // namespace tierlm::kernels
