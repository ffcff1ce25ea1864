// Fuzzes a POST body as /v1/messages and /v1/messages/count_tokens receive it: parse_anthropic_messages and
// parse_anthropic_count_tokens (every rejection must be an ApiError 400), then, for a request that parses, the prompt
// the server would build from it over the embedded default model's template. A template rejecting the conversation
// is an ApiError 400, never a crash.
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/tokenizer/tokenizer.h"
#include "server/anthropic_messages.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "tests/fuzz/fuzz_harness.h"

namespace {

using namespace tierlm;

server::ChatPrompt& tiny_prompt() {
  static server::ChatPrompt prompt = [] {
    const auto dir = fuzz::source_dir() / "profiles/models/tierlm-tiny";
    return server::ChatPrompt::load(dir, std::nullopt, tok::Tokenizer::load(dir));
  }();
  return prompt;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::silence_logs();
  (void)tiny_prompt();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = fuzz::as_text(data, size);
  for (bool count_tokens : {false, true}) {
    std::optional<server::AnthropicRequest> parsed;
    try {
      parsed = count_tokens ? server::parse_anthropic_count_tokens(body) : server::parse_anthropic_messages(body);
    } catch (const server::ApiError& e) {
      TIERLM_FUZZ_CHECK(e.status() == 400);
      continue;
    }
    TIERLM_FUZZ_CHECK(parsed->request.endpoint == server::Endpoint::chat);
    try {
      (void)tiny_prompt().render(parsed->request.messages, parsed->request.tools);
    } catch (const server::ApiError& e) {
      TIERLM_FUZZ_CHECK(e.status() == 400);
    }
  }
  return 0;
}
