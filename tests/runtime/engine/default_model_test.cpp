// End to end on the embedded default model (profiles/models/tierlm-tiny, bf16 weights, its own BPE tokenizer):
// text -> our tokenizer -> our forward pass -> greedy tokens -> text, against transformers' greedy run recorded by
// tools/make_fixtures.py.
#include <fstream>
#include <sstream>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "runtime/engine/generator.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace tierlm;

TEST(DefaultModel, GreedyCompletionsMatchTransformers) {
  const std::filesystem::path dir = std::filesystem::path(TIERLM_SOURCE_DIR) / "profiles/models/tierlm-tiny";
  std::ifstream in(dir / "reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const auto ref = boost::json::parse(ss.str()).as_object();

  tiering::Ledger ledger;
  model::LoadOptions options;
  options.ledger = &ledger;
  const auto weights = model::load_model(dir, options);
  const auto tokenizer = tok::Tokenizer::load(dir);
  kernels::ThreadPool pool(2);
  engine::Forward forward(weights, pool, ledger, 16, 256);
  for (const auto& p : ref.at("prompts").as_array()) {
    const auto& o = p.as_object();
    const std::string text(o.at("text").as_string());
    std::vector<int32_t> expected_prompt, expected;
    for (auto& v : o.at("prompt").as_array()) expected_prompt.push_back(int32_t(v.as_int64()));
    for (auto& v : o.at("greedy").as_array()) expected.push_back(int32_t(v.as_int64()));

    engine::GenerationRequest request;
    request.prompt = tokenizer.encode(text, true);
    ASSERT_EQ(request.prompt, expected_prompt) << text;
    request.max_tokens = int64_t(expected.size());
    request.ignore_stop_tokens = true;
    engine::Generator generator(forward, ledger, 256);
    std::vector<int32_t> got;
    tok::StreamDecoder stream(tokenizer, /*skip_special_tokens=*/true);  // as tokenizers.decode defaults
    std::string streamed;
    generator.generate(request, [&](int32_t t) {
      got.push_back(t);
      streamed += stream.step(t);
      return true;
    });
    streamed += stream.flush();
    EXPECT_EQ(got, expected) << text;
    EXPECT_EQ(streamed, std::string(o.at("completion").as_string())) << text;
  }
}
