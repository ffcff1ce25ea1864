// server/openai_request.h — parses and validates the JSON body of POST /v1/chat/completions and /v1/completions into
// one CompletionRequest. Every rejection is an ApiError (400) naming the offending parameter, as OpenAI does.
// Unknown fields are ignored (SDKs send newer ones); known fields of the wrong type or range are refused.
// Never: tokenizes or touches the model (the service checks lengths against the context after tokenizing).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/value.hpp>

#include "runtime/engine/sampler.h"

namespace tierlm::server {

enum class Endpoint { chat, completion };

// response_format: what the output must be. json_object: any JSON object; json_schema: valid against `schema`
// (strict or not, the output only ever holds the declared properties).
struct StructuredOutput {
  enum class Kind { text, json_object, json_schema };
  Kind kind = Kind::text;
  std::string name;                       // json_schema.name
  boost::json::value schema;              // json_schema.schema (null: any JSON value)
  bool strict = false;
};

// tool_choice: auto (the model decides), none (no tools offered, no parsing), required / function (the model must
// call one / the named one: enforced by constrained decoding, see tool_choice_constraint.h).
enum class ToolChoice { auto_, none, required, function };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::chat;
  std::string model;                      // empty when the client sent none
  // chat: messages normalized for the template: role, content (string; "" when null), plus tool_calls (arguments
  // parsed to objects when they are JSON), tool_call_id and name when given.
  boost::json::array messages;
  boost::json::value tools;               // null or the tools array, passed to the template
  ToolChoice tool_choice = ToolChoice::auto_;
  std::string tool_choice_name;           // ToolChoice::function: the function's name
  bool parallel_tool_calls = true;        // false: at most one call is returned (the first)
  // Extra template variables: chat_template_kwargs (e.g. enable_thinking), plus reasoning_effort when given.
  boost::json::object template_kwargs;
  // completion: the prompt as text, or as token ids when the client sent ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  bool prompt_is_tokens = false;

  std::optional<int64_t> max_tokens;      // max_completion_tokens, else max_tokens
  int n = 1;                              // choices, each its own sequence (seed + i when seeded)
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  int top_logprobs = -1;                  // -1: no logprobs (chat: logprobs=false; completion: logprobs absent)
  bool ignore_eos = false;                // extension (vLLM's name): generate exactly max_tokens, for benchmarks
  StructuredOutput structured_output;     // response_format
};

// Throws ApiError for malformed JSON, wrong types, out-of-range values and unsupported options (n != 1, echo, ...).
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint);

// Shared with the Responses decoder: tool_choice's keywords ("auto", "none", "required"; false for any other), and
// the checks once tools and tool_choice are read (required / a named function need tools; the name must be one of
// them), ApiError(400, param tool_choice) otherwise.
bool tool_choice_keyword(std::string_view value, ToolChoice& out);
void check_tool_choice(const CompletionRequest& r);

}  // namespace tierlm::server
