// runtime/kernels/kernel_dispatch.cpp — picks the kernel backend at run time from the CPU's features, with a
// process-wide override for tests and benchmarks.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

namespace {
std::atomic<int> g_forced{-1};

// CPUID leaf 7: EDX bits 22 (AMX-BF16) and 24 (AMX-TILE); subleaf 1 EAX bit 5 (AVX512-BF16). Then Linux's permission
// for the tile data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), without which the first tile instruction
// faults.
bool amx_granted() {
  static const bool granted = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

std::atomic<bool> g_amx_on{[] {
  const char* v = std::getenv("TIERLM_AMX");
  return !(v && std::string(v) == "0");
}()};
}  // namespace

bool amx_supported() { return detected_isa() == Isa::avx512 && amx_granted(); }

bool amx_enabled() {
  return g_amx_on.load(std::memory_order_relaxed) && active_isa() == Isa::avx512 && amx_supported();
}

void set_amx_for_testing(bool on) {
  if (on && !amx_supported())
    throw std::invalid_argument("set_amx_for_testing: this CPU or OS gives no AMX tiles (AMX-BF16, AMX-TILE, "
                                "AVX512-BF16 and the tile state permission are needed)");
  g_amx_on.store(on, std::memory_order_relaxed);
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
