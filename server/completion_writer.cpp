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
    if (delta.empty() && logprobs.empty()) return {};
    return sse(format_.chunk(index, delta, logprobs, "", false, include_usage_, first_call));
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

std::unique_ptr<CompletionWriter> make_openai_writer(ResponseFormat format, bool include_usage) {
  return std::make_unique<OpenAIWriter>(std::move(format), include_usage);
}

}  // namespace tierlm::server
