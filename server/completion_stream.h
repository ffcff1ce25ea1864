// server/completion_stream.h — one request's generation as the HTTP layer sees it: the scheduler's observer that
// turns tokens into text (UTF-8 safe, special tokens skipped), cuts it at stop strings, keeps logprobs, and hands
// the pieces to the connection's thread through take(). Also builds the OpenAI JSON for them (full body or chunks).
// Never: blocks the engine thread (on_token only appends under a short lock and calls the notifier).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/value.hpp>

#include "runtime/engine/scheduler.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/assistant_output.h"
#include "server/openai_request.h"
#include "server/stop_matcher.h"

namespace tierlm::server {

struct LogprobEntry {
  std::string token;
  std::string bytes;  // the token's own bytes (a token may end mid-UTF-8 character; `token` then shows U+FFFD)
  float logprob = 0;
  struct Top {
    std::string token, bytes;
    float logprob = 0;
  };
  std::vector<Top> top;
  int64_t text_offset = 0;  // bytes of completion text before this token's (legacy completions format)
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// What the connection takes out at once: new text and logprobs, and the end when it has come.
struct CompletionPiece {
  std::string text;
  std::vector<LogprobEntry> logprobs;
  bool finished = false;
  std::string finish_reason;   // OpenAI's: "stop" | "length"; or "cancelled" / "error"
  std::string stop_sequence;   // the stop string that ended it, if one did
  std::string error;
  Usage usage;
};

class CompletionStream : public engine::SequenceObserver {
 public:
  // keep_special_tokens: decode special tokens into the text (formats whose tool-call markers are special tokens).
  CompletionStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stops, bool logprobs,
                   bool keep_special_tokens = false);

  bool on_token(const engine::TokenOutput& token) override;
  void on_finish(const engine::SequenceResult& result) override;

  // Called (from the engine thread) when take() has something new; set before submitting.
  void set_notifier(std::function<void()> notify) { notify_ = std::move(notify); }
  CompletionPiece take();

 private:
  const tok::Tokenizer& tokenizer_;
  tok::StreamDecoder decoder_;
  StopMatcher matcher_;
  bool logprobs_;
  std::function<void()> notify_;
  std::mutex mutex_;
  CompletionPiece pending_;
  std::atomic<bool> notified_{false};
  int64_t emitted_bytes_ = 0;
};

// The OpenAI JSON bodies of one response.
struct ResponseFormat {
  Endpoint endpoint = Endpoint::chat;
  std::string id;
  std::string model;
  int64_t created = 0;
  bool logprobs = false;

  // One finished choice (completions: the text is output.content).
  struct Choice {
    AssistantDelta output;
    std::vector<LogprobEntry> logprobs;
    std::string finish_reason;
  };
  std::string full(const std::vector<Choice>& choices, const Usage& usage) const;
  // A stream chunk of choice `index`; role_chunk: the first chat chunk carrying the assistant role; finish_reason
  // empty: null. first_call: how many tool calls this choice has streamed before (their delta indexes follow).
  std::string chunk(int index, const AssistantDelta& delta, const std::vector<LogprobEntry>& logprobs,
                    const std::string& finish_reason, bool role_chunk, bool usage_null, int first_call = 0) const;
  // A stream chunk with one piece of tool call `call_index` of choice `index`, as OpenAI streams calls: the first
  // (header given) carries the call's id, type, name and `arguments` (""), the next ones only an arguments piece.
  std::string tool_call_chunk(int index, int call_index, const ToolCall* header, std::string_view arguments,
                              bool usage_null) const;
  std::string usage_chunk(const Usage& usage) const;

 private:
  std::string chunk_body(boost::json::array choices, bool usage_null, const boost::json::value* usage) const;
};

}  // namespace tierlm::server
