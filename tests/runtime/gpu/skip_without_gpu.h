// tests/runtime/gpu/skip_without_gpu.h — the GPU tests' first line: without a usable GPU (no device, no driver, a
// build without CUDA, no cuBLAS) the test skips and prints why, so a CI log shows the reason next to the test.
#pragma once

#include <cstdio>

#include <gtest/gtest.h>

#include "runtime/gpu/gpu_probe.h"

#define SKIP_WITHOUT_GPU()                                                                             \
  do {                                                                                                 \
    if (!tierlm::gpu::gpu_available()) {                                                               \
      std::printf("[  SKIP    ] no GPU: %s\n", tierlm::gpu::gpu_unavailable_reason().c_str());         \
      GTEST_SKIP() << tierlm::gpu::gpu_unavailable_reason();                                           \
    }                                                                                                  \
  } while (0)
