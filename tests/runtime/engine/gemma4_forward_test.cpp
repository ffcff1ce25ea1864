// Gemma 4 through the one forward pass, against transformers 5.17 (tools/make_fixtures.py made the fixtures on the
// device): gemma4-dense (E2B-like: per-layer inputs, KV shared by the last 3 layers, double-wide MLP there, full
// layers with head_dim 32), gemma4-moe (26B-A4B-like: k_eq_v full layer with 1 KV head, 8 experts top-2 beside the
// dense MLP, soft-capping) and gemma4-cg (the ConditionalGeneration text tower beside vision tensors). The MoE
// fixtures also run in moe_forward_test's streaming / warm / packed cases. Here: logits at every prompt position and
// each greedy step within 1e-3 relative, 32 greedy tokens exact; chunked prefill (1, 5, 24 tokens) equal to the
// whole prompt (windowed rings sized for the chunk, KV-shared layers reading their source), a batch equal to each
// sequence alone, and discriminating checks (the per-layer inputs and the soft-cap matter).
#include <algorithm>

#include <gtest/gtest.h>

#include "tests/runtime/engine/fixture_checks.h"

#include "runtime/model/model.h"

using namespace tierlm;

namespace {

using tierlm::fixtures::fixture;
using tierlm::fixtures::last_logits_error;
const auto load = tierlm::fixtures::load_fixture;

class Gemma4MatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(Gemma4MatchesTransformers, LogitsAndGreedyTokens) {
  tiering::Ledger ledger;
  tierlm::fixtures::expect_logits_and_greedy(load(GetParam(), ledger), GetParam(), ledger);
}

// The 24-token prompt outruns the window of 8, so windowed rings wrap; KV-shared layers read their source's pages.
TEST_P(Gemma4MatchesTransformers, ChunkedPrefillEqualsWholePrefill) {
  tiering::Ledger ledger;
  tierlm::fixtures::expect_chunked_prefill_equals_whole(load(GetParam(), ledger), GetParam(), ledger);
}

TEST_P(Gemma4MatchesTransformers, BatchOfSequencesEqualsEachAlone) {
  tiering::Ledger ledger;
  tierlm::fixtures::expect_batch_equals_alone(load(GetParam(), ledger), GetParam(), ledger);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Gemma4MatchesTransformers,
                         // gemma4-moe-mlx4: gemma4-moe in mlx-lm's 4-bit layout (group 32, router at 8 bits,
                         // bf16 scales); its reference ran the dequantized weights, which MLX's math (f32
                         // activations, runtime/kernels/affine_f32.h) reproduces.
                         ::testing::Values("gemma4-dense", "gemma4-moe", "gemma4-cg", "gemma4-moe-mlx4"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The fixtures discriminate: without the per-layer inputs the logits are far from transformers'; without the
// soft-cap (cap 30 over this random model's small logits) they miss the 1e-3 bound the fixture tests hold.
TEST(Gemma4Forward, PerLayerInputsAndSoftCapMatter) {
  tiering::Ledger ledger;
  model::ModelWeights dense = load("gemma4-dense", ledger);
  ASSERT_LT(last_logits_error(dense, "gemma4-dense", ledger), 1e-3);
  dense.config.per_layer_input_size = 0;
  EXPECT_GT(last_logits_error(dense, "gemma4-dense", ledger), 1e-2);
  model::ModelWeights moe = load("gemma4-moe", ledger);
  moe.config.final_logit_softcapping = 0;
  EXPECT_GT(last_logits_error(moe, "gemma4-moe", ledger), 2e-3);
}

}  // namespace
