// server/assistant_output.h — splits what a chat model generates into what the OpenAI and Anthropic APIs return
// apart: reasoning (Qwen3 / DeepSeek `<think>...</think>`, gpt-oss's analysis channel), content, and tool calls in
// each family's own wire format (Qwen2.5/Qwen3 `<tool_call>{json}</tool_call>`, Qwen3-Coder / Qwen3.5
// `<function=...><parameter=...>` blocks, Llama-3.x JSON, Mistral `[TOOL_CALLS]`, Gemma 4 `<|tool_call>call:...`,
// gpt-oss harmony, DeepSeek-V3 `<｜tool▁calls▁begin｜>`). The format is picked from the chat template's source.
//
// Streaming: push() takes text in pieces of any size and returns what is decided; text that may still turn out to
// be a marker is held back. A tool call is released whole, once its block has closed and parsed, so a block that
// fails to parse (malformed, or truncated by max_tokens) comes back as content, exactly as the non-streamed result
// would. The concatenation of every push() and finish() is the same whatever the split (tested byte by byte and
// token by token against one push).
// Owns: the held-back text and the call counter. Never: throws on model output, or drops text it cannot parse.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/array.hpp>

namespace tierlm::server {

enum class ToolCallFormat { none, hermes, qwen_xml, llama3_json, mistral, gemma4, harmony, deepseek_v3 };

const char* to_string(ToolCallFormat format);
// The format a chat template teaches its model, from markers in the template's source; `none` when there are none.
ToolCallFormat detect_tool_call_format(std::string_view template_source);
// Formats whose markers are special tokens: the text must be decoded with special tokens kept.
bool needs_special_tokens(ToolCallFormat format);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct AssistantDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls, in order
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(AssistantDelta&& other);
};

struct AssistantOutputOptions {
  ToolCallFormat format = ToolCallFormat::none;
  bool parse_tool_calls = false;  // tools were offered (and tool_choice is not "none")
  bool split_reasoning = false;   // `<think>` blocks (and harmony's analysis channel) go to reasoning
  bool starts_in_reasoning = false;  // the prompt already opened `<think>`: output begins inside it
  std::string id_prefix = "call_";   // tool call ids are id_prefix + index
  boost::json::array tools;          // the request's tools, for typing qwen_xml parameter values
};

class AssistantOutputParser {
 public:
  explicit AssistantOutputParser(AssistantOutputOptions options);
  ~AssistantOutputParser();
  AssistantOutputParser(AssistantOutputParser&&) noexcept;
  AssistantOutputParser& operator=(AssistantOutputParser&&) noexcept;

  AssistantDelta push(std::string_view text);
  // End of generation: whatever was held back, an open tool block parsed if it can be, else as content.
  AssistantDelta finish();

  // Whole text at once (push + finish).
  static AssistantDelta parse(std::string_view text, const AssistantOutputOptions& options);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierlm::server
