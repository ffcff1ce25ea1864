// server/responses_api.h — the OpenAI Responses API subset over the same engine: POST /v1/responses with `input`
// as a string or a list of items (messages with input_text / output_text parts, function_call and
// function_call_output items, and the reasoning items a previous response returned), `instructions`, function
// `tools` and `tool_choice`, `max_output_tokens`, `temperature` / `top_p`, `text.format` (json_object / json_schema
// through the grammar engine) and `reasoning.effort`. The decoder is a pure function from body text to a
// CompletionRequest in the chat route's normalized form (so the template sees what transformers would pass) or an
// ApiError naming the field. The writer renders the response object (output items: reasoning, message with
// output_text, function_call with call_id and arguments; usage) or the event sequence OpenAI streams:
// response.created, response.in_progress, then per item output_item.added, content_part.added, *.delta, *.done,
// content_part.done, output_item.done, and response.completed (response.incomplete at max_output_tokens).
// Never: stores a response (`store: true` and `previous_response_id` are 400 naming the field), tokenizes, or
// touches the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/json/object.hpp>

#include "server/completion_writer.h"
#include "server/openai_request.h"

namespace tierlm::server {

struct ResponsesRequest {
  CompletionRequest request;  // endpoint chat; messages normalized; tools in the chat route's function shape
  boost::json::object echo;   // the request's settings a response object repeats (instructions, tools, text, ...)
};

// Throws ApiError(400) naming the parameter for anything malformed, missing or unsupported.
ResponsesRequest parse_responses_request(std::string_view body);

std::unique_ptr<CompletionWriter> make_responses_writer(std::string model, boost::json::object echo);

}  // namespace tierlm::server
