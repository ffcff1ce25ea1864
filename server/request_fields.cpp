#include "server/request_fields.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "server/api_error.h"

namespace tierlm::server {

namespace {

// `user` is accepted everywhere it is defined: it only labels the request for the client's own bookkeeping.
constexpr std::string_view kChat[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stream", "stream_options",
    "logprobs", "top_logprobs", "n", "tools", "tool_choice", "parallel_tool_calls", "logit_bias", "user",
    "chat_template_kwargs", "reasoning_effort", "response_format", "ignore_eos"};
constexpr std::string_view kCompletions[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "seed", "stop", "stream", "stream_options", "logprobs", "n", "echo",
    "suffix", "best_of", "logit_bias", "user", "ignore_eos", "response_format"};
constexpr std::string_view kMessages[] = {
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "metadata", "thinking"};
constexpr std::string_view kCountTokens[] = {"model", "messages", "system", "tools", "tool_choice", "thinking"};
// store and previous_response_id are read to refuse what they ask for (server-side storage), by name.
constexpr std::string_view kResponses[] = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "text", "reasoning", "stream", "store", "previous_response_id", "metadata", "user"};

}  // namespace

std::span<const std::string_view> accepted_fields(BodyKind kind) {
  switch (kind) {
    case BodyKind::chat_completions: return kChat;
    case BodyKind::completions: return kCompletions;
    case BodyKind::anthropic_messages: return kMessages;
    case BodyKind::anthropic_count_tokens: return kCountTokens;
    case BodyKind::responses: return kResponses;
  }
  return {};
}

void reject_unknown_fields(const boost::json::object& object, std::span<const std::string_view> accepted,
                           std::string_view parent) {
  for (const auto& kv : object) {
    const std::string_view key(kv.key().data(), kv.key().size());
    if (std::find(accepted.begin(), accepted.end(), key) != accepted.end()) continue;
    const std::string name = parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
    throw ApiError(400, fmt::format("Unrecognized request argument supplied: {} (tierlm does not implement it).", name),
                   "invalid_request_error", name, "unknown_parameter");
  }
}

void reject_unknown_fields(const boost::json::object& body, BodyKind kind) {
  reject_unknown_fields(body, accepted_fields(kind), "");
}

}  // namespace tierlm::server
