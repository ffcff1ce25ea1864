// tests/runtime/kernels/isa_test_util.h — the kernel tests' ISA helpers: every ISA this CPU runs (to force each in
// turn with set_isa_for_testing), and a guard that puts the detected one back when a test ends.
#pragma once

#include <vector>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels::isa_testing {

inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> out{Isa::scalar};
  if (detected_isa() >= Isa::avx2) out.push_back(Isa::avx2);
  if (detected_isa() >= Isa::avx512) out.push_back(Isa::avx512);
  return out;
}

struct IsaGuard {
  IsaGuard() = default;
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;
  ~IsaGuard() { set_isa_for_testing(detected_isa()); }
};

}  // namespace tierlm::kernels::isa_testing
