#include "server/service.h"

#include <chrono>
#include <random>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "calibrate/calibration.h"
#include "server/api_error.h"
#include "server/tool_choice_constraint.h"

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
  return start(parse_completion_request(body, endpoint), std::move(notify), deadline);
}

namespace {
bool tools_offered(const CompletionRequest& req) {
  return req.tools.is_array() && !req.tools.get_array().empty() && req.tool_choice != ToolChoice::none;
}
}  // namespace

std::vector<int32_t> Service::render_prompt(const CompletionRequest& req, bool* starts_in_reasoning) const {
  // tool_choice "none": the model is not shown the tools, so it is not invited to call them.
  const boost::json::value no_tools;
  const std::string text =
      chat_prompt_.render(req.messages, tools_offered(req) ? req.tools : no_tools, req.template_kwargs);
  if (starts_in_reasoning) {
    const size_t end = text.find_last_not_of(" \t\r\n");
    *starts_in_reasoning = end != std::string::npos && end >= 6 && text.compare(end - 6, 7, "<think>") == 0;
  }
  return tokenizer_.encode(text, /*add_special_tokens=*/false);  // the template places BOS itself
}

std::shared_ptr<const grammar::Grammar> Service::constraint_grammar(const CompletionRequest& req,
                                                                   bool starts_in_reasoning) {
  const bool forced_call = req.tool_choice == ToolChoice::required || req.tool_choice == ToolChoice::function;
  if (!forced_call) return structured_.compiled(req.structured_output);
  if (req.endpoint != Endpoint::chat)
    throw ApiError(400, "'tool_choice' applies to chat requests only.", "invalid_request_error", "tool_choice",
                   "invalid_value");
  if (req.structured_output.kind != StructuredOutput::Kind::text)
    throw ApiError(400, "'response_format' and tool_choice 'required' or a named function cannot be combined: the "
                        "output is either a tool call or the formatted answer.",
                   "invalid_request_error", "response_format", "invalid_value");
  if (starts_in_reasoning)
    throw ApiError(400, "tool_choice 'required' or a named function with a prompt that opens a <think> block is not "
                        "supported: the call would be read as reasoning. Disable thinking (chat_template_kwargs "
                        "{\"enable_thinking\": false}) or use tool_choice 'auto'.",
                   "invalid_request_error", "tool_choice", "unsupported_value");
  ToolCallConstraintSpec spec = tool_choice_spec(req, chat_prompt_.tool_call_format());
  for (const auto& marker : tool_choice_markers(spec.format))
    if (const int32_t id = tokenizer_.token_to_id(marker); id >= 0 && tokenizer_.is_special(id))
      spec.special_markers.push_back(marker);
  const std::string& source = chat_prompt_.tool_template_source();
  return structured_.compiled(tool_choice_key(spec, source), [&] { return compile_tool_choice(spec, source); });
}

int64_t Service::count_prompt_tokens(const CompletionRequest& req) const {
  return int64_t(render_prompt(req, nullptr).size());
}

StartedCompletion Service::start(CompletionRequest req, std::function<void()> notify,
                                 std::chrono::steady_clock::time_point deadline) {
  const Endpoint endpoint = req.endpoint;
  if (!req.model.empty() && req.model != model_id_)
    throw ApiError(404, fmt::format("The model `{}` does not exist or you do not have access to it.", req.model),
                   "invalid_request_error", "model", "model_not_found");
  for (const auto& [token, bias] : req.sampling.logit_bias)
    if (token >= tokenizer_.vocab_size())
      throw ApiError(400, fmt::format("Invalid key '{}' in 'logit_bias': the vocabulary has {} tokens.", token,
                                      tokenizer_.vocab_size()), "invalid_request_error", "logit_bias", "invalid_value");

  engine::SequenceParams params;
  const char* prompt_param = endpoint == Endpoint::chat ? "messages" : "prompt";
  bool starts_in_reasoning = false;
  if (endpoint == Endpoint::chat) {
    params.prompt = render_prompt(req, &starts_in_reasoning);
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
  // One grammar per request (response_format, or tool_choice required / named); each choice walks its own
  // constraint over it, since the grammar's position is per-sequence state. 400 for either's errors.
  const std::shared_ptr<const grammar::Grammar> grammar = constraint_grammar(req, starts_in_reasoning);
  if (!req.ignore_eos) {
    params.stop_tokens = tokenizer_.eos_ids();
    if (endpoint == Endpoint::chat)
      for (const auto& t : chat_prompt_.end_of_turn_tokens())
        if (int32_t id = tokenizer_.token_to_id(t); id >= 0) params.stop_tokens.push_back(id);
  }

  StartedCompletion started;
  const ToolCallFormat format = chat_prompt_.tool_call_format();
  if (endpoint == Endpoint::chat) {
    started.parse_output = true;
    started.output.format = format;
    started.output.parse_tool_calls = tools_offered(req) && format != ToolCallFormat::none;
    started.output.split_reasoning = chat_prompt_.has_reasoning();
    started.output.starts_in_reasoning = starts_in_reasoning;
    if (started.output.parse_tool_calls) started.output.tools = req.tools.get_array();
    started.single_tool_call = !req.parallel_tool_calls;
  }
  const bool keep_special = endpoint == Endpoint::chat && needs_special_tokens(format);
  for (int i = 0; i < req.n; ++i) {
    StartedChoice choice;
    choice.stream = std::make_shared<CompletionStream>(tokenizer_, req.stop, req.top_logprobs >= 0, keep_special);
    choice.stream->set_notifier(notify);
    started.choices.push_back(std::move(choice));
  }
  started.streaming = req.stream;
  started.prompt_tokens = prompt_tokens;
  started.include_usage = req.include_usage;
  started.format.endpoint = endpoint;
  started.format.id = random_id(endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-");
  started.format.model = model_id_;
  started.format.created = unix_now();
  started.format.logprobs = req.top_logprobs >= 0;
  started.output.id_prefix = random_id("call_") + "_";
  try {
    for (int i = 0; i < req.n; ++i) {
      engine::SequenceParams p = params;
      if (p.sampling.has_seed) p.sampling.seed += uint64_t(i);  // n choices differ, and stay reproducible
      if (grammar) p.constraint = structured_.constraint_for(grammar);
      started.choices[size_t(i)].handle = scheduler_.submit(std::move(p), started.choices[size_t(i)].stream);
    }
  } catch (const engine::QueueFullError& e) {
    for (auto& c : started.choices)
      if (c.handle) c.handle->cancel();
    telemetry_.record_rejected();
    throw ApiError(429, fmt::format("The server is busy: {}. Retry later.", e.what()), "server_overloaded", {},
                   "queue_full");
  } catch (const std::invalid_argument& e) {
    for (auto& c : started.choices)
      if (c.handle) c.handle->cancel();
    throw ApiError(400, e.what(), "invalid_request_error", {}, "invalid_value");
  }
  return started;
}

namespace {
json::object model_object(const std::string& id, int64_t created) {
  json::object m;
  m["id"] = id;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "tierlm";
  return m;
}
}  // namespace

std::string Service::models_json() const {
  json::object body;
  body["object"] = "list";
  body["data"] = json::array{model_object(model_id_, created_)};
  return json::serialize(body);
}

std::string Service::model_json(std::string_view id) const {
  if (id != model_id_)
    throw ApiError(404, fmt::format("The model '{}' does not exist", id), "invalid_request_error", "model",
                   "model_not_found");
  return json::serialize(model_object(model_id_, created_));
}

std::string Service::wisdom_json() const {
  const json::value plan = calibrate::active_plan_json();
  if (plan.is_null())
    throw ApiError(404, "No wisdom plan is active: the server was started with --no-wisdom (or before any "
                        "calibration), so it runs on defaults and command-line flags.", "not_found_error", {}, "no_plan");
  return json::serialize(plan);
}

}  // namespace tierlm::server
