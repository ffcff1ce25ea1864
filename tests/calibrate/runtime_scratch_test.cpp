// tests/calibrate/runtime_scratch_test.cpp — the plan's scratch account is what the engine allocates, and its weight
// classes hold every loaded matrix: for each MoE family (Qwen3-MoE, Qwen3.5 with DeltaNet layers, Gemma 4 with wider
// full layers and the dense MLP beside the experts, DeepSeek-V2/V3 with MLA), the measured profile's prediction.memory["scratch"] equals the
// ledger's scratch after Forward is built for the plan's step rows (prefill chunk + batch), plus the gathered logits
// of a decode batch, on a pool of the plan's threads (each a prefill lane of the MoE block). (Gemma-4-26B-A4B
// served at defaults failed at start when the shape formula undercounted it by ~40 MiB: bench/results/headline.md;
// a DeepSeek-V2-Lite shape failed the same way while the measured classes left out MLA's projections.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "runtime/engine/forward.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "tests/calibrate/planner_profiles.h"
#include "tiering/ledger.h"

namespace tierlm::calibrate {
namespace {

namespace fs = std::filesystem;

class RuntimeScratch : public ::testing::TestWithParam<std::string> {};

TEST_P(RuntimeScratch, PlanCountsWhatForwardAllocates) {
  const fs::path dir = fs::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / GetParam();
  ModelProfileOptions o;
  o.max_prompts = 1;
  o.max_tokens_per_prompt = 2;
  o.threads = 1;
  const ModelProfile p = measure_model_profile(dir, o);
  ASSERT_GT(p.scratch_row_bytes, 0u);
  // Survives the wisdom file.
  const ModelProfile back = model_profile_from_json(to_json(p));
  EXPECT_EQ(back.scratch_row_bytes, p.scratch_row_bytes);
  EXPECT_EQ(back.scratch_fixed_bytes, p.scratch_fixed_bytes);

  PlanRequest r;
  r.budget_bytes = 1ull << 30;
  r.context = 256;
  r.batch = 4;
  r.kv_codec = back.layer_latent_floats.empty() ? "f16" : "f32";  // MLA keeps its latent in f32
  const Plan plan = make_plan(test_profiles::device("laptop-8gb"), back, r);
  ASSERT_EQ(plan.batch, 4);

  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  const model::ModelWeights m = model::load_model(dir, load);
  // The weight classes hold every loaded matrix (a DeltaNet layer's fused in-projection, Gemma 4's per-layer inputs
  // included), so the plan's weights account is no smaller than what loading charges.
  EXPECT_GE(p.dense_bytes(), m.bytes()) << GetParam();
  kernels::ThreadPool pool(plan.threads, /*pin=*/false);  // the MoE block's prefill lanes: one per thread
  ASSERT_GT(plan.threads, 1) << "a plan whose threads exercise the lanes";
  const uint64_t before = ledger.used(tiering::accounts::scratch);
  engine::Forward forward(m, pool, ledger, plan.prefill_chunk + plan.batch, 256);
  const uint64_t engine = ledger.used(tiering::accounts::scratch) - before;
  const uint64_t gathered_logits = uint64_t(plan.batch * m.config.vocab_size) * sizeof(float);
  EXPECT_EQ(plan.prediction.memory.at("scratch"), engine + gathered_logits)
      << GetParam() << ": prefill chunk " << plan.prefill_chunk << ", batch " << plan.batch;
}

INSTANTIATE_TEST_SUITE_P(MoeFamilies, RuntimeScratch,
                         ::testing::Values("qwen3_moe", "qwen3_5_moe", "gemma4-moe", "gemma4-moe-mlx4", "deepseek_v2",
                                           "deepseek_v3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace tierlm::calibrate
