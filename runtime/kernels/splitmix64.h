// runtime/kernels/splitmix64.h — SplitMix64 (Steele, Lea, Flood 2014): a fixed, portable stream of 64-bit numbers,
// the same on every machine and run. TurboQuant's rotation and codebook tables (runtime/kv/turbo_quant.cpp) and the
// synthetic model writers (tools/peer/synthetic_routing.h) draw from it. Never: anything that needs unpredictability.
#pragma once

#include <cstdint>

namespace tierlm::kernels {

// Advances `state` and returns the next number of its stream.
inline uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace tierlm::kernels
