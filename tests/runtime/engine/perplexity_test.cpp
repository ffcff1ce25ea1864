// Oracle: transformers 5.17 (tools/train_quality_model.py on the device) — the per-token negative log-likelihood of
// profiles/text/kv-quality.txt under tests/fixtures/models/code-small (a small llama trained on the Python standard
// library, head_dim 128, held-out perplexity 14.4), computed in float32 from the saved bf16 weights. tierlm's
// tokenizer must give the same ids, and engine::perplexity with the exact f32 cache the same NLL at every position,
// whatever the chunk. The lossy codecs are then measured against that exact cache (printed: the planner's rule is
// that a lossy codec is picked only where it costs at most 1% perplexity; see calibrate's KV quality pass).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "reference_fixture.h"
#include "runtime/engine/perplexity.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace tierlm;

namespace {

struct Reference {
  std::vector<int32_t> ids;
  std::vector<double> nll;
  double perplexity = 0;
};

Reference reference() {
  const boost::json::value ref = fixtures::read_json(fixtures::fixture("code-small") / "reference.json");
  Reference r;
  const auto& text = ref.at("text").as_object();
  for (auto& t : text.at("ids").as_array()) r.ids.push_back(int32_t(t.as_int64()));
  for (auto& x : text.at("nll").as_array()) r.nll.push_back(x.to_number<double>());
  r.perplexity = text.at("perplexity").to_number<double>();
  return r;
}

TEST(Perplexity, TokenizerGivesTheReferenceIds) {
  std::ifstream in(std::string(TIERLM_SOURCE_DIR) + "/profiles/text/kv-quality.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const tok::Tokenizer t = tok::Tokenizer::load(fixtures::fixture("code-small").string());
  std::vector<int32_t> ids = t.encode(ss.str(), /*add_special_tokens=*/true);
  const Reference ref = reference();
  ASSERT_GE(ids.size(), ref.ids.size());
  ids.resize(ref.ids.size());
  EXPECT_EQ(ids, ref.ids);
}

// Over the 1,024 positions the model was trained on, every chunk size gives transformers' NLL at every position within
// 1e-4 nats (measured: 1.2e-5) and chunk 1 (decode), 64 and 500 agree with each other. (The first reference scored
// the training script's in-memory copy, whose rotary inv_freq had been rounded to bf16 by .to(bfloat16): 0.10 nats
// off at some positions, with transformers itself on the saved files agreeing with tierlm, not with it.)
TEST(Perplexity, ExactCacheGivesTransformersNllAtEveryPosition) {
  const Reference ref = reference();
  ASSERT_EQ(ref.nll.size() + 1, ref.ids.size());
  ASSERT_EQ(ref.ids.size(), 1024u);
  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  const model::ModelWeights w = model::load_model(fixtures::fixture("code-small"), load);
  kernels::ThreadPool pool(2);
  std::vector<double> first;
  for (int64_t chunk : {int64_t(64), int64_t(1), int64_t(500)}) {
    const size_t n = chunk == 1 ? 400 : 1024;  // chunk 1 is decode: a prefix only, it is the slow case
    const auto r = engine::perplexity(w, pool, ledger, std::span(ref.ids).first(n), {kv::Codec::f32, {}, {}}, chunk);
    ASSERT_EQ(r.nll.size(), n - 1);
    double worst = 0, sum = 0;
    for (size_t i = 0; i < r.nll.size(); ++i) {
      worst = std::max(worst, std::fabs(r.nll[i] - ref.nll[i]));
      sum += ref.nll[i];
    }
    EXPECT_LT(worst, 1e-4) << "chunk " << chunk << ": largest per-token NLL difference (nats)";
    EXPECT_NEAR(r.mean_nll, sum / double(r.nll.size()), 1e-5) << "chunk " << chunk;
    if (first.empty()) {
      first = r.nll;
    } else {
      for (size_t i = 0; i < r.nll.size(); ++i) ASSERT_NEAR(r.nll[i], first[i], 1e-4) << "chunk " << chunk << " pos " << i;
    }
    std::printf("chunk %lld: %zu tokens, perplexity %.4f (transformers %.4f), largest per-token |NLL difference| "
                "%.2e\n", (long long)chunk, r.nll.size(), r.perplexity(), std::exp(sum / double(r.nll.size())), worst);
  }
}

TEST(Perplexity, LossyCodecsAgainstTheExactCache) {
  const Reference ref = reference();
  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  const model::ModelWeights w = model::load_model(fixtures::fixture("code-small"), load);
  kernels::ThreadPool pool(2);
  const auto ids = std::span(ref.ids).first(1024);
  const double exact = engine::perplexity(w, pool, ledger, ids, {kv::Codec::f32, {}, {}}, 64).perplexity();
  for (kv::Codec c : {kv::Codec::f16, kv::Codec::q8, kv::Codec::turbo4, kv::Codec::turbo3}) {
    const double p = engine::perplexity(w, pool, ledger, ids, {c, {}, {}}, 64).perplexity();
    std::printf("%-7s perplexity %.4f (%+.3f%% vs the f32 cache)\n", kv::codec_name(c), p,
                100 * (p / exact - 1));
    // f16 and q8 are near-exact on any model. The turbo codecs must meet the planner's rule (at most 1% perplexity,
    // calibrate/kv_quality.h) on this trained model, so the planner may pick them: turbo3 with 3-bit keys + QJL
    // measured +1.45% here (+2.4% averaged over six rotation seeds, bench/kv_loss_bench), now 4-bit MSE keys -0.01%;
    // turbo4 +0.80%.
    if (c == kv::Codec::f16) {
      EXPECT_LT(std::fabs(p / exact - 1), 1e-3);
    }
    if (c == kv::Codec::q8) {
      EXPECT_LT(std::fabs(p / exact - 1), 5e-3);
    }
    if (c == kv::Codec::turbo3 || c == kv::Codec::turbo4) {
      EXPECT_LE(p / exact - 1, 0.01) << kv::codec_name(c) << ": the planner's 1% rule";
    }
  }
  EXPECT_GT(ledger.peak(), 0u);
}

TEST(Perplexity, RefusesTooFewTokensAndTooLongTexts) {
  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  const model::ModelWeights w = model::load_model(fixtures::fixture("code-small"), load);
  kernels::ThreadPool pool(1);
  const std::vector<int32_t> one = {5};
  EXPECT_THROW(engine::perplexity(w, pool, ledger, one, {}, 8), std::invalid_argument);
  const std::vector<int32_t> longer(size_t(w.config.max_position_embeddings + 1), 5);
  EXPECT_THROW(engine::perplexity(w, pool, ledger, longer, {}, 64), std::invalid_argument);
  const std::vector<int32_t> bad = {5, int32_t(w.config.vocab_size)};
  EXPECT_ANY_THROW(engine::perplexity(w, pool, ledger, bad, {}, 8));
}

}  // namespace
