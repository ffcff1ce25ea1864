// server/anthropic_messages.h — the Anthropic Messages API over the same engine: POST /v1/messages (system, messages
// of text / tool_use / tool_result / thinking blocks, tools -> tool_use, tool_choice, stop_sequences, streaming) and
// /v1/messages/count_tokens. The decoders are pure functions from body text to a CompletionRequest in the OpenAI
// route's normalized form (so the chat template sees what transformers would pass) or an ApiError, so fuzz harnesses
// can call them. The writer renders a message body or the event sequence message_start, content_block_start /
// _delta / _stop, message_delta, message_stop; errors go out as {"type":"error","error":{"type","message"}}.
// Never: tokenizes or touches the engine; accepts a field it does not implement (request_fields.h lists them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/completion_writer.h"
#include "server/openai_request.h"

namespace tierlm::server {

struct AnthropicRequest {
  CompletionRequest request;  // endpoint chat; messages normalized; tools in OpenAI's function shape
};

// Throws ApiError(400) naming the parameter for anything malformed, missing or unsupported.
AnthropicRequest parse_anthropic_messages(std::string_view body);
AnthropicRequest parse_anthropic_count_tokens(std::string_view body);

// The Anthropic stop_reason for the loop's OpenAI finish_reason.
std::string anthropic_stop_reason(const std::string& finish_reason, const std::string& stop_sequence);
std::string anthropic_error_body(const ApiError& error);
std::string anthropic_count_tokens_body(int64_t input_tokens);
// prompt_tokens: known before the first token, for message_start's usage.
std::unique_ptr<CompletionWriter> make_anthropic_writer(std::string model, int64_t prompt_tokens);

}  // namespace tierlm::server
