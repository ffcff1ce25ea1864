// End to end on the embedded default model (profiles/models/tierlm-tiny: a small Qwen3-MoE, bf16 weights, its own BPE
// tokenizer, trained on docstrings and tool dialogs by tools/train_default_model.py): text -> our tokenizer -> our
// forward pass -> greedy tokens -> text, against transformers' greedy runs recorded there; and held-out tool dialogs
// rendered by our template engine -> the same prompt ids as transformers' apply_chat_template -> the same greedy
// tokens -> the server's parser finds the tool call the dialog expects.
#include <algorithm>
#include <cstdio>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "runtime/engine/generator.h"
#include "server/assistant_output.h"
#include "server/chat_prompt.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/runtime/engine/reference_fixture.h"

using namespace tierlm;

namespace {

std::vector<int32_t> ids_of(const boost::json::value& v) {
  std::vector<int32_t> out;
  for (auto& x : v.as_array()) out.push_back(int32_t(x.as_int64()));
  return out;
}

}  // namespace

TEST(DefaultModel, GreedyCompletionsMatchTransformers) {
  const std::filesystem::path dir = std::filesystem::path(TIERLM_SOURCE_DIR) / "profiles/models/tierlm-tiny";
  const boost::json::value ref_value = fixtures::read_json(dir / "reference.json");
  const auto& ref = ref_value.as_object();

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
    const std::vector<int32_t> expected_prompt = ids_of(o.at("prompt")), expected = ids_of(o.at("greedy"));

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


TEST(DefaultModel, HeldOutToolDialogsMatchTransformersAndParseIntoTheExpectedCall) {
  const std::filesystem::path dir = std::filesystem::path(TIERLM_SOURCE_DIR) / "profiles/models/tierlm-tiny";
  const boost::json::value ref_value = fixtures::read_json(dir / "reference.json");
  const auto& ref = ref_value.as_object();
  ASSERT_TRUE(ref.contains("dialogs")) << "reference.json has no tool dialogs: regenerate with tools/train_default_model.py";
  tiering::Ledger ledger;
  model::LoadOptions options;
  options.ledger = &ledger;
  const auto weights = model::load_model(dir, options);
  EXPECT_GT(weights.config.num_experts, 1) << "the default model is a MoE, so a first run shows the expert tier";
  const auto tokenizer = tok::Tokenizer::load(dir);
  const auto prompt = server::ChatPrompt::load(dir, std::nullopt, tokenizer);
  ASSERT_EQ(prompt.tool_call_format(), server::ToolCallFormat::hermes);
  kernels::ThreadPool pool(2);
  engine::Forward forward(weights, pool, ledger, 16, 1024);
  int calls_expected = 0, right_tool = 0, right_arguments = 0;
  for (const auto& d : ref.at("dialogs").as_array()) {
    const auto& o = d.as_object();
    const std::string text = prompt.render(o.at("messages").as_array(), o.at("tools"));
    const std::vector<int32_t> expected_prompt = ids_of(o.at("prompt")), expected = ids_of(o.at("greedy"));
    engine::GenerationRequest request;
    request.prompt = tokenizer.encode(text, true);
    ASSERT_EQ(request.prompt, expected_prompt) << text;
    // transformers recorded 40 greedy tokens; we run on to 64 so a call cut at 40 closes (same model, same math).
    request.max_tokens = std::max<int64_t>(64, int64_t(expected.size()));
    request.ignore_stop_tokens = true;
    engine::Generator generator(forward, ledger, 1024);
    std::vector<int32_t> got;
    generator.generate(request, [&](int32_t t) {
      got.push_back(t);
      return true;
    });
    ASSERT_GE(got.size(), expected.size());
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + int64_t(expected.size())), expected) << text;
    // The server's view of the turn: the text up to <|im_end|>, parsed as the template's tool-call format.
    std::string completion = tokenizer.decode(got, /*skip_special_tokens=*/false);
    completion = completion.substr(0, completion.find("<|im_end|>"));
    server::AssistantOutputOptions parse;
    parse.format = prompt.tool_call_format();
    parse.parse_tool_calls = !o.at("tools").as_array().empty();
    parse.tools = o.at("tools").as_array();
    const server::AssistantDelta out = server::AssistantOutputParser::parse(completion, parse);
    if (o.at("expect_tool").is_string()) {
      ++calls_expected;
      ASSERT_EQ(out.tool_calls.size(), 1u) << completion;
      EXPECT_TRUE(out.content.empty()) << completion;
      if (out.tool_calls[0].name == o.at("expect_tool").as_string()) ++right_tool;
      if (boost::json::parse(out.tool_calls[0].arguments) == o.at("expect_arguments")) ++right_arguments;
    } else {
      EXPECT_TRUE(out.tool_calls.empty()) << completion;
      EXPECT_FALSE(out.content.empty()) << completion;
    }
  }
  // Every dialog that needs a tool gets a well-formed call of the right tool. Arguments copy the request's entities;
  // for entities training never showed (held-out dialogs mix them in) the model may substitute a familiar one, so
  // they are reported, not asserted: reference.json tool_eval holds the rates over 200 held-out dialogs.
  EXPECT_GT(calls_expected, 0);
  EXPECT_EQ(right_tool, calls_expected);
  std::printf("default model, held-out dialogs: right tool %d/%d, right arguments %d/%d\n", right_tool,
              calls_expected, right_arguments, calls_expected);
}
