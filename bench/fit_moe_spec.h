// bench/fit_moe_spec.h — the small synthetic MoE fit_accuracy_bench measures fit against (8 layers x 32 experts,
// top-4, 1024 hidden, 1024 x 1024 q4 experts: ~480 MiB of experts) and moe_prefill_bench times one layer of.
#pragma once

#include "runtime/model/synthetic_moe.h"

namespace tierlm::bench {

inline model::SyntheticMoeSpec fit_moe_spec() {
  return {.layers = 8, .experts = 32, .top_k = 4, .hidden = 1024, .expert_intermediate = 1024, .heads = 16,
          .kv_heads = 4, .head_dim = 64, .vocab = 16384};
}

}  // namespace tierlm::bench
