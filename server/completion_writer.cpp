#include "server/completion_writer.h"

#include <fmt/format.h>

namespace tierlm::server {

namespace {

std::string sse(const std::string& data) { return fmt::format("data: {}\n\n", data); }

class OpenAIWriter final : public CompletionWriter {
 public:
  OpenAIWriter(ResponseFormat format, bool include_usage) : format_(std::move(format)), include_usage_(include_usage) {}

  std::string stream_start(int choices) override {
    if (format_.endpoint != Endpoint::chat) return {};
    std::string out;
    for (int i = 0; i < choices; ++i) out += sse(format_.chunk(i, {}, {}, "", true, include_usage_));
    return out;
  }
  std::string stream_delta(int index, const AssistantDelta& delta, const std::vector<LogprobEntry>& logprobs,
                           int first_call) override {
    std::string out;
    if (!delta.reasoning.empty() || !delta.content.empty() || !logprobs.empty()) {
      AssistantDelta text;
      text.reasoning = delta.reasoning;
      text.content = delta.content;
      out += sse(format_.chunk(index, text, logprobs, "", false, include_usage_, first_call));
    }
    for (size_t i = 0; i < delta.tool_calls.size(); ++i) {
      const ToolCall& call = delta.tool_calls[i];
      const int call_index = first_call + int(i);
      out += sse(format_.tool_call_chunk(index, call_index, &call, "", include_usage_));
      for (const std::string& piece : argument_pieces(call.arguments))
        out += sse(format_.tool_call_chunk(index, call_index, nullptr, piece, include_usage_));
    }
    return out;
  }
  std::string stream_choice_end(int index, const std::string& finish_reason, const std::string&, const Usage&) override {
    return sse(format_.chunk(index, {}, {}, finish_reason, false, include_usage_));
  }
  std::string stream_end(const Usage& total) override {
    std::string out;
    if (include_usage_) out += sse(format_.usage_chunk(total));
    return out + "data: [DONE]\n\n";
  }
  std::string stream_error(const ApiError& error) override { return sse(error.body()) + "data: [DONE]\n\n"; }
  std::string full(const std::vector<ResponseFormat::Choice>& choices, const std::string&, const Usage& total) override {
    return format_.full(choices, total);
  }

 private:
  ResponseFormat format_;
  bool include_usage_;
};

}  // namespace

std::vector<std::string> argument_pieces(std::string_view arguments) {
  std::vector<std::string> pieces;
  size_t start = 0, depth = 0;
  bool in_string = false, escaped = false;
  const bool object = !arguments.empty() && arguments.front() == '{';
  for (size_t i = 0; object && i < arguments.size(); ++i) {
    const char c = arguments[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if ((c == '}' || c == ']') && depth > 0) --depth;
    else if (c == ',' && depth == 1) {
      pieces.emplace_back(arguments.substr(start, i + 1 - start));
      start = i + 1;
    }
  }
  if (start < arguments.size() || pieces.empty()) pieces.emplace_back(arguments.substr(start));
  return pieces;
}

std::unique_ptr<CompletionWriter> make_openai_writer(ResponseFormat format, bool include_usage) {
  return std::make_unique<OpenAIWriter>(std::move(format), include_usage);
}

}  // namespace tierlm::server
