// Fuzzes a POST body as /v1/chat/completions and /v1/completions receive it: parse_completion_request for both
// endpoints (every rejection must be an ApiError), then, for a chat request that parses, the prompt the server
// would build: ChatPrompt over the embedded default model's template, and Qwen3's tool-aware template (the real one,
// from the template fixtures) with the request's tools. A template rejecting the conversation is a TemplateError
// (ChatPrompt: ApiError 400), never a crash.
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <boost/json.hpp>

#include "runtime/template/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/openai_request.h"
#include "tests/fuzz/fuzz_harness.h"

namespace {

using namespace tierlm;

struct Prompts {
  std::optional<server::ChatPrompt> tiny;
  std::optional<tmpl::ChatTemplate> qwen3;
  boost::json::object qwen3_special = {{"bos_token", ""}, {"eos_token", "<|im_end|>"}};
};

tmpl::TemplateLimits small_limits() {
  tmpl::TemplateLimits limits;
  limits.render.max_output_bytes = 256 << 10;
  return limits;
}

Prompts& prompts() {
  static Prompts p = [] {
    Prompts out;
    const auto tiny_dir = fuzz::source_dir() / "profiles/models/tierlm-tiny";
    out.tiny.emplace(server::ChatPrompt::load(tiny_dir, std::nullopt, tok::Tokenizer::load(tiny_dir)));
    std::ifstream in(fuzz::source_dir() / "tests/fixtures/templates/qwen3.jsonl");
    std::string first_line;
    std::getline(in, first_line);
    const auto meta = boost::json::parse(first_line).at("meta");
    out.qwen3.emplace(tmpl::ChatTemplate::parse(std::string(meta.at("template").as_string()), small_limits()));
    return out;
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::silence_logs();
  (void)prompts();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = fuzz::as_text(data, size);
  for (server::Endpoint endpoint : {server::Endpoint::chat, server::Endpoint::completion}) {
    std::optional<server::CompletionRequest> request;
    try {
      request = server::parse_completion_request(body, endpoint);
    } catch (const server::ApiError& e) {
      TIERLM_FUZZ_CHECK(e.status() == 400);
      continue;
    }
    TIERLM_FUZZ_CHECK(request->endpoint == endpoint);
    if (endpoint != server::Endpoint::chat) continue;
    try {
      (void)prompts().tiny->render(request->messages, request->tools);
    } catch (const server::ApiError& e) {
      TIERLM_FUZZ_CHECK(e.status() == 400);
    }
    try {
      (void)tmpl::render_chat(*prompts().qwen3, request->messages, true, request->tools, prompts().qwen3_special);
    } catch (const tmpl::TemplateError&) {
    }
  }
  return 0;
}
