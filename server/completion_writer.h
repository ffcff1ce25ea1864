// server/completion_writer.h — the wire shape of a completion response, apart from the loop that drives it: the
// HTTP layer takes each choice's text, splits it (AssistantOutputParser) and hands the pieces to a writer, which
// renders OpenAI chat/completions JSON and SSE chunks, or Anthropic Messages events. Writers are plain string
// builders, so each API's shape is tested without sockets.
// Never: decides finish reasons (the loop does) or touches the engine.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/completion_stream.h"

namespace tierlm::server {

class CompletionWriter {
 public:
  virtual ~CompletionWriter() = default;
  // Streaming: what goes out first (OpenAI: one role chunk per choice; Anthropic: message_start).
  virtual std::string stream_start(int choices) = 0;
  virtual std::string stream_delta(int index, const AssistantDelta& delta, const std::vector<LogprobEntry>& logprobs,
                                   int first_call) = 0;
  // A choice ended; finish_reason is OpenAI's ("stop" | "length" | "tool_calls").
  virtual std::string stream_choice_end(int index, const std::string& finish_reason, const std::string& stop_sequence,
                                        const Usage& usage) = 0;
  // After every choice ended (usage chunk, [DONE] / message_stop).
  virtual std::string stream_end(const Usage& total) = 0;
  virtual std::string stream_error(const ApiError& error) = 0;
  // Not streaming: the whole body.
  virtual std::string full(const std::vector<ResponseFormat::Choice>& choices, const std::string& stop_sequence,
                           const Usage& total) = 0;
};

// OpenAI /v1/chat/completions and /v1/completions. A streamed tool call goes out as OpenAI sends one: a chunk with
// its id, type and name, then its arguments in pieces (argument_pieces).
std::unique_ptr<CompletionWriter> make_openai_writer(ResponseFormat format, bool include_usage);

// A call's arguments (the text of a JSON object) in the pieces every API's stream sends them in: one per top-level
// member, each ending with the comma after it (the first also holds the '{', the last the '}'), so the pieces joined
// are the text. A call is released once its block has closed and parsed (AssistantOutputParser), so a malformed one
// is content; its arguments then stream in these pieces. Text that is not an object is one piece.
std::vector<std::string> argument_pieces(std::string_view arguments);

}  // namespace tierlm::server
