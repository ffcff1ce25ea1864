#include "server/service.h"

#include <chrono>
#include <random>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "calibrate/calibration.h"
#include "server/api_error.h"

namespace tierlm::server {

namespace json = boost::json;

namespace {
int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}
}  // namespace

Service::Service(std::string model_id, tok::Tokenizer tokenizer, ChatPrompt chat_prompt, engine::Scheduler& scheduler,
                 Telemetry& telemetry)
    : model_id_(std::move(model_id)), tokenizer_(std::move(tokenizer)), chat_prompt_(std::move(chat_prompt)),
      scheduler_(scheduler), telemetry_(telemetry), structured_(tokenizer_, &telemetry.ledger()),
      created_(unix_now()) {}

StartedCompletion Service::start_completion(std::string_view body, Endpoint endpoint, std::function<void()> notify,
                                            std::chrono::steady_clock::time_point deadline) {
  CompletionRequest req = parse_completion_request(body, endpoint);
  if (!req.model.empty() && req.model != model_id_)
    throw ApiError(404, fmt::format("The model `{}` does not exist or you do not have access to it.", req.model),
                   "invalid_request_error", "model", "model_not_found");

  engine::SequenceParams params;
  const char* prompt_param = endpoint == Endpoint::chat ? "messages" : "prompt";
  if (endpoint == Endpoint::chat) {
    const std::string text = chat_prompt_.render(req.messages, req.tools);
    params.prompt = tokenizer_.encode(text, /*add_special_tokens=*/false);  // the template places BOS itself
  } else if (req.prompt_is_tokens) {
    params.prompt = req.prompt_tokens;  // ids outside the vocabulary are refused by the scheduler (400)
  } else {
    params.prompt = tokenizer_.encode(req.prompt_text, /*add_special_tokens=*/true);
  }
  const int64_t context = scheduler_.context();
  const int64_t prompt_tokens = int64_t(params.prompt.size());
  if (prompt_tokens == 0)
    throw ApiError(400, "The prompt is empty (it encodes to no tokens).", "invalid_request_error", prompt_param,
                   "invalid_value");
  if (req.max_tokens ? prompt_tokens + *req.max_tokens > context : prompt_tokens >= context)
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                               "({} in the {}, {} in the completion). Please reduce the length of the {} or completion.",
                               context, prompt_tokens + req.max_tokens.value_or(1), prompt_tokens, prompt_param,
                               req.max_tokens.value_or(1), prompt_param),
                   "invalid_request_error", prompt_param, "context_length_exceeded");
  params.max_tokens = req.max_tokens.value_or(context - prompt_tokens);
  params.sampling = req.sampling;
  params.top_logprobs = req.top_logprobs;
  params.deadline = deadline;
  params.constraint = structured_.constraint_for(req.structured_output);  // response_format (400 for its errors)
  if (!req.ignore_eos) {
    params.stop_tokens = tokenizer_.eos_ids();
    if (endpoint == Endpoint::chat)
      for (const auto& t : chat_prompt_.end_of_turn_tokens())
        if (int32_t id = tokenizer_.token_to_id(t); id >= 0) params.stop_tokens.push_back(id);
  }

  StartedCompletion started;
  started.stream = std::make_shared<CompletionStream>(tokenizer_, req.stop, req.top_logprobs >= 0);
  started.stream->set_notifier(std::move(notify));
  started.streaming = req.stream;
  started.include_usage = req.include_usage;
  started.format.endpoint = endpoint;
  started.format.id = random_id(endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-");
  started.format.model = model_id_;
  started.format.created = unix_now();
  started.format.logprobs = req.top_logprobs >= 0;
  try {
    started.handle = scheduler_.submit(std::move(params), started.stream);
  } catch (const engine::QueueFullError& e) {
    telemetry_.record_rejected();
    throw ApiError(429, fmt::format("The server is busy: {}. Retry later.", e.what()), "server_overloaded", {},
                   "queue_full");
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "invalid_request_error", {}, "invalid_value");
  }
  return started;
}

std::string Service::models_json() const {
  json::object m;
  m["id"] = model_id_;
  m["object"] = "model";
  m["created"] = created_;
  m["owned_by"] = "tierlm";
  json::object body;
  body["object"] = "list";
  body["data"] = json::array{std::move(m)};
  return json::serialize(body);
}

std::string Service::wisdom_json() const {
  const json::value plan = calibrate::active_plan_json();
  if (plan.is_null())
    throw ApiError(404, "No wisdom plan is active: the server was started with --no-wisdom (or before any "
                        "calibration), so it runs on defaults and command-line flags.", "not_found_error", {}, "no_plan");
  return json::serialize(plan);
}

}  // namespace tierlm::server
