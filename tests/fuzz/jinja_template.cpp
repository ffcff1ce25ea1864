// Fuzzes a Jinja chat template: ChatTemplate::parse, then render_chat over a fixed chat-like conversation (system,
// user, assistant with a tool call, tool result, user; a tool list; special tokens; extra variables of every JSON
// kind) with small render limits, so a hostile template ends in TemplateError quickly instead of hanging or growing.
#include <cstdint>
#include <string>

#include <boost/json.hpp>

#include "runtime/template/chat_template.h"
#include "tests/fuzz/fuzz_harness.h"

namespace {

constexpr const char* kContext = R"({
  "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? <b>&amp;</b>"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "4", "tool_call_id": "call_1", "name": "add"},
    {"role": "assistant", "content": "<think>easy</think>4"},
    {"role": "user", "content": "Thanks \u00e9\u4f60 \ud83d\ude00"}
  ],
  "tools": [{"type": "function", "function": {"name": "add", "description": "Adds.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}],
  "extra": {"xs": [3, 1, 2], "s": "  Hello World  ", "d": {"b": 2, "a": 1, "c": null}, "f": 1.5, "n": -7,
            "big": 18446744073709551615, "t": true, "enable_thinking": false},
  "special": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
})";

struct Context {
  boost::json::array messages;
  boost::json::value tools;
  boost::json::object extra, special;
};

const Context& context() {
  static const Context c = [] {
    const boost::json::object o = boost::json::parse(kContext).as_object();
    return Context{o.at("messages").as_array(), o.at("tools"), o.at("extra").as_object(), o.at("special").as_object()};
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tierlm::fuzz::silence_logs();
  (void)context();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlm::tmpl;
  TemplateLimits limits;
  limits.render.max_output_bytes = 64 << 10;
  limits.render.max_loop_iterations = 20000;
  const Context& c = context();
  try {
    const ChatTemplate chat = ChatTemplate::parse(std::string(tierlm::fuzz::as_text(data, size)), limits);
    for (bool with_tools : {true, false}) {
      try {
        const std::string out = render_chat(chat, c.messages, /*add_generation_prompt=*/with_tools,
                                            with_tools ? c.tools : boost::json::value(nullptr), c.special, c.extra);
        TIERLM_FUZZ_CHECK(out.size() <= limits.render.max_output_bytes);
      } catch (const TemplateError&) {
      }
    }
  } catch (const TemplateError&) {
  }
  return 0;
}
