// runtime/model/synthetic.h — random-weight models of any shape, built straight into ledger memory, for benchmarks
// (a "1B-class llama" without a 2 GB download). Deterministic for a seed.
#pragma once

#include <cstdint>

#include "runtime/model/model.h"

namespace tierlm::model {

// Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 heads / 8 kv heads, intermediate 8192, vocab 128256.
ModelConfig llama_1b_config();

ModelWeights synthetic_model(const ModelConfig& config, kernels::WeightFormat format, tiering::Ledger& ledger,
                             uint64_t seed = 1);

}  // namespace tierlm::model
