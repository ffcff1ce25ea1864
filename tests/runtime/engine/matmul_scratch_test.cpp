// The kernels' working memory (the int8 activations of quantized weights, MXFP4's split activations, MLX's group
// sums) is ledger memory: Forward reserves, at construction, what matvec/matmul of max_chunk rows by each of its
// weights takes (kernels::matmul_scratch_sizes, the dispatch's own rule), charged to "scratch", and makes it the
// calling thread's for each step. Checked per layer kind and weight format on the fixtures: a prefill of the whole
// chunk and decode steps neither grow Forward's scratch (the reservation covered every multiplication, routed experts
// and the head included) nor touch the thread's own unaccounted scratch (no multiplication escaped the scope).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tests/runtime/engine/fixture_checks.h"

#include "runtime/engine/forward.h"
#include "runtime/kernels/matmul_scratch.h"
#include "runtime/model/model.h"

using namespace tierlm;

namespace {

struct Case {
  std::string fixture;
  std::optional<kernels::WeightFormat> format;  // dense weights and experts (nullopt: as stored)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << "/" << (c.format ? kernels::format_name(*c.format) : "stored");
}

class MatmulScratchTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulScratchTest, ForwardReservesEveryMultiplicationsScratchInTheLedger) {
  const Case& c = GetParam();
  tiering::Ledger ledger;
  model::LoadOptions o = fixtures::fixture_load_options(ledger);
  o.weight_format = c.format;
  o.expert_format = c.format;
  const model::ModelWeights w = model::load_model(fixtures::fixture(c.fixture), o);
  const std::vector<int32_t> prompt = fixtures::reference_prompt(fixtures::fixture(c.fixture));
  const int64_t chunk = int64_t(prompt.size());

  kernels::ThreadPool pool(2);
  const uint64_t scratch_before = ledger.used(tiering::accounts::scratch);
  engine::Forward forward(w, pool, ledger, chunk, 64);
  const uint64_t reserved = forward.matmul_scratch_bytes();
  EXPECT_GE(ledger.used(tiering::accounts::scratch) - scratch_before, reserved) << "the reservation is in the ledger";

  kernels::MatmulScratch& own = kernels::MatmulScratch::current();  // this thread's scratch outside any Forward
  const uint64_t own_before = own.bytes();
  engine::KVCache cache(w.config, 64, ledger, fixtures::exact_kv());
  std::vector<float> logits(size_t(w.config.vocab_size));
  forward.run(prompt, 0, cache, logits.data());
  for (int64_t s = 0; s < 3; ++s) {
    const int32_t next = fixtures::argmax(logits.data(), w.config.vocab_size);
    forward.run(std::span(&next, 1), chunk + s, cache, logits.data());
  }
  EXPECT_EQ(forward.matmul_scratch_bytes(), reserved) << "a multiplication needed more than was reserved";
  EXPECT_EQ(own.bytes(), own_before) << "a multiplication used the thread's unaccounted scratch";
  std::printf("[%s] %d-row chunk: matmul scratch %llu bytes reserved\n", c.fixture.c_str(), int(chunk),
              static_cast<unsigned long long>(reserved));
}

using kernels::WeightFormat;
INSTANTIATE_TEST_SUITE_P(
    Fixtures, MatmulScratchTest,
    ::testing::Values(Case{"llama3", WeightFormat::q8_0}, Case{"llama3", WeightFormat::q4},
                      Case{"llama3", WeightFormat::f16}, Case{"llama3-mlx4", std::nullopt},
                      Case{"qwen3_moe", WeightFormat::q8_0}, Case{"gpt_oss-mxfp4", std::nullopt},
                      Case{"deepseek_v2", WeightFormat::q4}, Case{"qwen3_5_moe", WeightFormat::q8_0},
                      Case{"gemma4-moe", WeightFormat::q8_0}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = i.param.fixture + "_" + (i.param.format ? kernels::format_name(*i.param.format) : "stored");
      for (char& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

}  // namespace
