#include "server/responses_api.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "server/json_fields.h"
#include "server/request_fields.h"

namespace tierlm::server {

namespace json = boost::json;
using namespace jsonf;

namespace {

// A message's content: a string, or parts of type input_text / output_text (concatenated). Images, files and
// audio are not something these models read: 400 naming the part.
std::string content_text(const json::value& v, const std::string& param) {
  if (v.is_string()) return std::string(v.get_string());
  if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
  std::string out;
  for (size_t i = 0; i < v.get_array().size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const auto& part = object_at(v.get_array()[i], p);
    const std::string type = required_string(part, "type", p + ".type");
    if (type != "input_text" && type != "output_text")
      invalid(p + ".type", fmt::format("Content part type '{}' is not supported (input_text and output_text only).",
                                       type), "unsupported_value");
    out += required_string(part, "text", p + ".text");
  }
  return out;
}

// The reasoning text of a reasoning item a previous response returned (its reasoning_text parts).
std::string reasoning_text(const json::object& item, const std::string& param) {
  std::string out;
  const json::value* content = field(item, "content");
  if (!content) return out;
  if (!content->is_array()) wrong_type(param + ".content", "an array", *content);
  for (size_t i = 0; i < content->get_array().size(); ++i) {
    const std::string p = fmt::format("{}.content[{}]", param, i);
    const auto& part = object_at(content->get_array()[i], p);
    const std::string type = required_string(part, "type", p + ".type");
    if (type != "reasoning_text")
      invalid(p + ".type", fmt::format("Reasoning content type '{}' is not supported.", type), "unsupported_value");
    out += required_string(part, "text", p + ".text");
  }
  return out;
}

// input -> the chat route's normalized messages. Consecutive function_call items (and a reasoning item before
// them) join one assistant message, as a chat client would have sent the turn; each function_call_output becomes
// a role "tool" message carrying the call's name.
json::array convert_input(const json::object& body) {
  json::array out;
  if (auto instructions = string(body, "instructions", "instructions")) {
    json::object m;
    m["role"] = "system";
    m["content"] = *instructions;
    out.push_back(std::move(m));
  }
  const json::value* input = field(body, "input");
  if (!input) missing("input");
  if (input->is_string()) {
    json::object m;
    m["role"] = "user";
    m["content"] = input->get_string();
    out.push_back(std::move(m));
    return out;
  }
  if (!input->is_array()) wrong_type("input", "a string or an array of input items", *input);
  if (input->get_array().empty()) invalid("input", "'input' must contain at least one item.");
  std::map<std::string, std::string> call_names;  // call_id -> function name
  // The assistant message being assembled from reasoning / function_call items (index into out), or none.
  std::optional<size_t> open_assistant;
  auto assistant = [&]() -> json::object& {
    if (!open_assistant) {
      json::object m;
      m["role"] = "assistant";
      m["content"] = "";
      out.push_back(std::move(m));
      open_assistant = out.size() - 1;
    }
    return out[*open_assistant].get_object();
  };
  for (size_t i = 0; i < input->get_array().size(); ++i) {
    const std::string p = fmt::format("input[{}]", i);
    const auto& item = object_at(input->get_array()[i], p);
    const std::string type = string(item, "type", p + ".type").value_or("message");
    if (type == "message") {
      std::string role = required_string(item, "role", p + ".role");
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system")
        invalid(p + ".role", fmt::format("Invalid value: '{}'. Supported values are: 'user', 'assistant', 'system' "
                                         "and 'developer'.", role));
      const json::value* content = field(item, "content");
      if (!content) missing(p + ".content");
      std::string text = content_text(*content, p + ".content");
      if (role == "assistant") {
        json::object& m = assistant();
        // Text after this turn's calls starts a new turn; text before them is this turn's.
        if (m.contains("tool_calls")) {
          open_assistant.reset();
          assistant()["content"] = std::move(text);
        } else {
          m["content"] = std::string(m["content"].as_string()) + text;
        }
        continue;
      }
      open_assistant.reset();
      json::object m;
      m["role"] = role;
      m["content"] = std::move(text);
      out.push_back(std::move(m));
    } else if (type == "function_call") {
      const std::string call_id = required_string(item, "call_id", p + ".call_id");
      const std::string name = required_string(item, "name", p + ".name");
      const std::string arguments = required_string(item, "arguments", p + ".arguments");
      boost::system::error_code ec;
      json::value args = json::parse(arguments, ec);
      if (ec || !args.is_object())
        invalid(p + ".arguments", "'arguments' must be the JSON text of an object.");
      call_names[call_id] = name;
      json::object fn;
      fn["name"] = name;
      fn["arguments"] = std::move(args);  // templates expect a mapping (they apply tojson), as transformers passes it
      json::object call;
      call["id"] = call_id;
      call["type"] = "function";
      call["function"] = std::move(fn);
      json::object& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
      m["tool_calls"].as_array().push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string call_id = required_string(item, "call_id", p + ".call_id");
      const json::value* output = field(item, "output");
      if (!output) missing(p + ".output");
      json::object r;
      r["role"] = "tool";
      r["tool_call_id"] = call_id;
      r["content"] = content_text(*output, p + ".output");
      if (auto it = call_names.find(call_id); it != call_names.end()) r["name"] = it->second;
      open_assistant.reset();
      out.push_back(std::move(r));
    } else if (type == "reasoning") {
      open_assistant.reset();  // a reasoning item opens the next assistant turn
      json::object& m = assistant();
      m["reasoning_content"] = reasoning_text(item, p);
    } else {
      invalid(p + ".type", fmt::format("Input item type '{}' is not supported (message, function_call, "
                                       "function_call_output and reasoning are).", type), "unsupported_value");
    }
  }
  return out;
}

// tools [{type:"function", name, description?, parameters?, strict?}] -> the chat route's function shape.
void convert_tools(const json::object& body, CompletionRequest& r, json::object& echo) {
  json::array echoed;
  if (const json::value* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    json::array out;
    std::vector<std::string> names;
    for (size_t i = 0; i < tools->get_array().size(); ++i) {
      const std::string p = fmt::format("tools[{}]", i);
      const auto& t = object_at(tools->get_array()[i], p);
      const std::string type = required_string(t, "type", p + ".type");
      if (type != "function")
        invalid(p + ".type", fmt::format("Tool type '{}' is not supported (only 'function': hosted tools need "
                                         "OpenAI's servers).", type), "unsupported_value");
      for (const auto& kv : t) {
        const std::string_view key(kv.key().data(), kv.key().size());
        if (key != "type" && key != "name" && key != "description" && key != "parameters" && key != "strict")
          invalid(p + "." + std::string(key), fmt::format("Unrecognized tool field: {}.", key), "unknown_parameter");
      }
      const std::string name = required_string(t, "name", p + ".name");
      if (name.empty()) missing(p + ".name");
      if (std::find(names.begin(), names.end(), name) != names.end())
        invalid(p + ".name", fmt::format("Duplicate function name '{}'.", name));
      names.push_back(name);
      json::object fn;
      fn["name"] = name;
      if (auto d = string(t, "description", p + ".description")) fn["description"] = *d;
      if (const json::value* params = field(t, "parameters")) fn["parameters"] = object_at(*params, p + ".parameters");
      json::object tool;
      tool["type"] = "function";
      tool["function"] = std::move(fn);
      out.push_back(std::move(tool));
      json::object e = t;
      if (!e.contains("description")) e["description"] = nullptr;
      if (!e.contains("strict")) e["strict"] = nullptr;
      echoed.push_back(std::move(e));
    }
    if (!out.empty()) r.tools = std::move(out);
  }
  echo["tools"] = std::move(echoed);
  echo["tool_choice"] = "auto";
  if (const json::value* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      if (!tool_choice_keyword(choice->get_string(), r.tool_choice))
        invalid("tool_choice", fmt::format("Invalid value: '{}'. Supported values are: 'none', 'auto' and "
                                           "'required', or {{\"type\": \"function\", \"name\": ...}}.",
                                           std::string_view(choice->get_string())));
    } else if (choice->is_object()) {
      const auto& c = choice->get_object();
      const std::string type = required_string(c, "type", "tool_choice.type");
      if (type != "function")
        invalid("tool_choice.type", fmt::format("tool_choice type '{}' is not supported (only 'function').", type),
                "unsupported_value");
      r.tool_choice = ToolChoice::function;
      r.tool_choice_name = required_string(c, "name", "tool_choice.name");
    } else {
      wrong_type("tool_choice", "a string or an object", *choice);
    }
    check_tool_choice(r);
    echo["tool_choice"] = *choice;
  }
  r.parallel_tool_calls = boolean(body, "parallel_tool_calls").value_or(true);
  echo["parallel_tool_calls"] = r.parallel_tool_calls;
}

// text: {format: {type: text | json_object | json_schema (name, schema, strict, description)}}.
void convert_text(const json::object& body, CompletionRequest& r, json::object& echo) {
  json::object format;
  format["type"] = "text";
  if (const json::value* text = field(body, "text")) {
    const auto& t = object_at(*text, "text");
    static constexpr std::string_view kText[] = {"format"};
    reject_unknown_fields(t, kText, "text");
    if (const json::value* f = field(t, "format")) {
      const auto& fo = object_at(*f, "text.format");
      const std::string type = required_string(fo, "type", "text.format.type");
      if (type == "json_object") {
        r.structured_output.kind = StructuredOutput::Kind::json_object;
      } else if (type == "json_schema") {
        static constexpr std::string_view kSchema[] = {"type", "name", "schema", "strict", "description"};
        reject_unknown_fields(fo, kSchema, "text.format");
        r.structured_output.kind = StructuredOutput::Kind::json_schema;
        r.structured_output.name = required_string(fo, "name", "text.format.name");
        const json::value* schema = field(fo, "schema");
        if (!schema) missing("text.format.schema");
        if (!schema->is_object() && !schema->is_bool()) wrong_type("text.format.schema", "an object", *schema);
        r.structured_output.schema = *schema;
        r.structured_output.strict = boolean(fo, "strict").value_or(false);
      } else if (type != "text") {
        invalid("text.format.type", fmt::format("Invalid value: '{}'. Supported values are: 'text', 'json_object' "
                                                "and 'json_schema'.", type));
      }
      format = fo;
    }
  }
  json::object echoed;
  echoed["format"] = std::move(format);
  echo["text"] = std::move(echoed);
}

CompletionRequest decode(const json::object& body, json::object& echo) {
  if (auto store = boolean(body, "store"); store && *store)
    invalid("store", "'store: true' is not supported: tierlm keeps no responses (send the conversation as 'input').",
            "unsupported_value");
  if (field(body, "previous_response_id"))
    invalid("previous_response_id", "'previous_response_id' is not supported: tierlm keeps no responses (send the "
                                    "conversation as 'input').", "unsupported_value");
  CompletionRequest r;
  r.endpoint = Endpoint::chat;
  if (auto model = string(body, "model", "model")) r.model = *model;
  r.messages = convert_input(body);
  convert_tools(body, r, echo);
  convert_text(body, r, echo);
  if (auto m = integer(body, "max_output_tokens", 1, int64_t(1) << 30)) r.max_tokens = *m;
  echo["max_output_tokens"] = r.max_tokens ? json::value(*r.max_tokens) : json::value(nullptr);
  auto& s = r.sampling;
  s.temperature = float(number(body, "temperature", 0, 2).value_or(1.0));
  s.top_p = float(number(body, "top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0.0f) invalid("top_p", "'top_p' must be greater than 0.");
  echo["temperature"] = double(s.temperature);
  echo["top_p"] = double(s.top_p);
  json::object reasoning;
  reasoning["effort"] = nullptr;
  reasoning["summary"] = nullptr;
  if (const json::value* v = field(body, "reasoning")) {
    const auto& ro = object_at(*v, "reasoning");
    static constexpr std::string_view kReasoning[] = {"effort"};
    reject_unknown_fields(ro, kReasoning, "reasoning");
    if (auto effort = string(ro, "effort", "reasoning.effort")) {
      if (*effort != "minimal" && *effort != "low" && *effort != "medium" && *effort != "high")
        invalid("reasoning.effort", fmt::format("Invalid value: '{}'. Supported values are: 'minimal', 'low', "
                                                "'medium' and 'high'.", *effort));
      r.template_kwargs["reasoning_effort"] = *effort;
      reasoning["effort"] = *effort;
    }
  }
  echo["reasoning"] = std::move(reasoning);
  r.stream = boolean(body, "stream").value_or(false);
  r.include_usage = true;
  echo["instructions"] = field(body, "instructions") ? body.at("instructions") : json::value(nullptr);
  if (const json::value* metadata = field(body, "metadata")) {
    const auto& mo = object_at(*metadata, "metadata");
    for (const auto& kv : mo)
      if (!kv.value().is_string()) wrong_type(fmt::format("metadata.{}", std::string_view(kv.key())), "a string",
                                              kv.value());
    echo["metadata"] = mo;
  } else {
    echo["metadata"] = json::object();
  }
  if (auto user = string(body, "user", "user")) echo["user"] = *user;
  return r;
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json::object usage_object(const Usage& u) {
  json::object in_details;
  in_details["cached_tokens"] = u.cached_tokens;
  json::object out_details;
  out_details["reasoning_tokens"] = 0;
  json::object o;
  o["input_tokens"] = u.prompt_tokens;
  o["input_tokens_details"] = std::move(in_details);
  o["output_tokens"] = u.completion_tokens;
  o["output_tokens_details"] = std::move(out_details);
  o["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  return o;
}

json::object output_text_part(const std::string& text) {
  json::object part;
  part["type"] = "output_text";
  part["text"] = text;
  part["annotations"] = json::array();
  part["logprobs"] = json::array();
  return part;
}

json::object reasoning_part(const std::string& text) {
  json::object part;
  part["type"] = "reasoning_text";
  part["text"] = text;
  return part;
}

// Output items; `status` is the item's ("in_progress" while streaming, then "completed" or "incomplete").
json::object message_item(const std::string& id, const char* status, const std::string* text) {
  json::object item;
  item["id"] = id;
  item["type"] = "message";
  item["status"] = status;
  item["role"] = "assistant";
  item["content"] = text ? json::array{output_text_part(*text)} : json::array();
  return item;
}

json::object reasoning_item(const std::string& id, const std::string* text) {
  json::object item;
  item["id"] = id;
  item["type"] = "reasoning";
  item["summary"] = json::array();
  item["content"] = text ? json::array{reasoning_part(*text)} : json::array();
  return item;
}

json::object function_call_item(const std::string& id, const char* status, const ToolCall& call,
                                 const std::string& arguments) {
  json::object item;
  item["id"] = id;
  item["type"] = "function_call";
  item["status"] = status;
  item["call_id"] = call.id;
  item["name"] = call.name;
  item["arguments"] = arguments;
  return item;
}

class ResponsesWriter final : public CompletionWriter {
 public:
  ResponsesWriter(std::string model, json::object echo)
      : model_(std::move(model)), echo_(std::move(echo)), id_(random_id("resp_")), created_(unix_now()) {}

  std::string stream_start(int) override {
    std::string out = lifecycle("response.created", response_object("in_progress", json::array(), nullptr));
    return out + lifecycle("response.in_progress", response_object("in_progress", json::array(), nullptr));
  }

  std::string stream_delta(int, const AssistantDelta& d, const std::vector<LogprobEntry>&, int) override {
    std::string out;
    if (!d.reasoning.empty()) out += text_delta(Open::reasoning, d.reasoning);
    if (!d.content.empty()) out += text_delta(Open::message, d.content);
    for (const auto& call : d.tool_calls) {
      out += close_item("completed");
      const int64_t index = int64_t(output_.size());
      const std::string item_id = random_id("fc_");
      json::object added;
      added["output_index"] = index;
      added["item"] = function_call_item(item_id, "in_progress", call, "");
      out += event("response.output_item.added", std::move(added));
      for (const std::string& piece : argument_pieces(call.arguments)) {
        json::object delta;
        delta["item_id"] = item_id;
        delta["output_index"] = index;
        delta["delta"] = piece;
        out += event("response.function_call_arguments.delta", std::move(delta));
      }
      json::object done;
      done["item_id"] = item_id;
      done["output_index"] = index;
      done["name"] = call.name;
      done["arguments"] = call.arguments;
      out += event("response.function_call_arguments.done", std::move(done));
      json::object item = function_call_item(item_id, "completed", call, call.arguments);
      output_.push_back(item);
      json::object item_done;
      item_done["output_index"] = index;
      item_done["item"] = std::move(item);
      out += event("response.output_item.done", std::move(item_done));
    }
    return out;
  }

  std::string stream_choice_end(int, const std::string& finish_reason, const std::string&, const Usage&) override {
    incomplete_ = finish_reason == "length";
    return close_item(incomplete_ ? "incomplete" : "completed");
  }

  std::string stream_end(const Usage& total) override {
    const char* status = incomplete_ ? "incomplete" : "completed";
    return lifecycle(incomplete_ ? "response.incomplete" : "response.completed",
                     response_object(status, output_, &total));
  }

  std::string stream_error(const ApiError& error) override {
    std::string out = close_item("incomplete");
    json::object e;
    e["code"] = error.code().empty() ? std::string("server_error") : error.code();
    e["message"] = std::string(error.what());
    json::object response = response_object("failed", output_, nullptr);
    response["error"] = std::move(e);
    return out + lifecycle("response.failed", std::move(response));
  }

  std::string full(const std::vector<ResponseFormat::Choice>& choices, const std::string&, const Usage& total) override {
    const auto& c = choices.at(0);
    const bool incomplete = c.finish_reason == "length";
    const char* status = incomplete ? "incomplete" : "completed";
    json::array output;
    if (!c.output.reasoning.empty()) output.push_back(reasoning_item(random_id("rs_"), &c.output.reasoning));
    if (!c.output.content.empty() || (c.output.tool_calls.empty() && c.output.reasoning.empty()))
      output.push_back(message_item(random_id("msg_"), status, &c.output.content));
    for (const auto& call : c.output.tool_calls)
      output.push_back(function_call_item(random_id("fc_"), "completed", call, call.arguments));
    incomplete_ = incomplete;
    return json::serialize(response_object(status, std::move(output), &total));
  }

 private:
  enum class Open { none, reasoning, message };

  std::string event(const char* type, json::object data) {
    json::object e;
    e["type"] = type;
    e["sequence_number"] = sequence_++;
    for (auto& kv : data) e[kv.key()] = std::move(kv.value());
    return fmt::format("event: {}\ndata: {}\n\n", type, json::serialize(e));
  }

  std::string lifecycle(const char* type, json::object response) {
    json::object data;
    data["response"] = std::move(response);
    return event(type, std::move(data));
  }

  json::object response_object(const char* status, json::array output, const Usage* usage) const {
    json::object r;
    r["id"] = id_;
    r["object"] = "response";
    r["created_at"] = created_;
    r["status"] = status;
    r["error"] = nullptr;
    json::value incomplete = nullptr;
    if (std::string_view(status) == "incomplete") {
      json::object details;
      details["reason"] = "max_output_tokens";
      incomplete = std::move(details);
    }
    r["incomplete_details"] = std::move(incomplete);
    r["model"] = model_;
    r["output"] = std::move(output);
    r["usage"] = usage ? json::value(usage_object(*usage)) : json::value(nullptr);
    r["store"] = false;
    r["previous_response_id"] = nullptr;
    for (const auto& kv : echo_) r[kv.key()] = kv.value();
    return r;
  }

  // Text continues the open item of its kind, or closes the open one and starts its own (item, then its part).
  std::string text_delta(Open kind, const std::string& text) {
    std::string out;
    if (open_ != kind) {
      out += close_item("completed");
      open_ = kind;
      open_id_ = random_id(kind == Open::message ? "msg_" : "rs_");
      open_text_.clear();
      json::object added;
      added["output_index"] = int64_t(output_.size());
      added["item"] = kind == Open::message ? message_item(open_id_, "in_progress", nullptr)
                                            : reasoning_item(open_id_, nullptr);
      out += event("response.output_item.added", std::move(added));
      json::object part;
      part["item_id"] = open_id_;
      part["output_index"] = int64_t(output_.size());
      part["content_index"] = 0;
      part["part"] = kind == Open::message ? output_text_part("") : reasoning_part("");
      out += event("response.content_part.added", std::move(part));
    }
    open_text_ += text;
    json::object delta;
    delta["item_id"] = open_id_;
    delta["output_index"] = int64_t(output_.size());
    delta["content_index"] = 0;
    delta["delta"] = text;
    if (kind == Open::message) delta["logprobs"] = json::array();
    out += event(kind == Open::message ? "response.output_text.delta" : "response.reasoning_text.delta",
                 std::move(delta));
    return out;
  }

  std::string close_item(const char* status) {
    if (open_ == Open::none) return {};
    const bool message = open_ == Open::message;
    const int64_t index = int64_t(output_.size());
    std::string out;
    json::object done;
    done["item_id"] = open_id_;
    done["output_index"] = index;
    done["content_index"] = 0;
    done["text"] = open_text_;
    if (message) done["logprobs"] = json::array();
    out += event(message ? "response.output_text.done" : "response.reasoning_text.done", std::move(done));
    json::object part;
    part["item_id"] = open_id_;
    part["output_index"] = index;
    part["content_index"] = 0;
    part["part"] = message ? output_text_part(open_text_) : reasoning_part(open_text_);
    out += event("response.content_part.done", std::move(part));
    json::object item = message ? message_item(open_id_, status, &open_text_) : reasoning_item(open_id_, &open_text_);
    output_.push_back(item);
    json::object item_done;
    item_done["output_index"] = index;
    item_done["item"] = std::move(item);
    out += event("response.output_item.done", std::move(item_done));
    open_ = Open::none;
    return out;
  }

  std::string model_;
  json::object echo_;
  std::string id_;
  int64_t created_;
  int64_t sequence_ = 0;
  json::array output_;  // finished output items, for the final response object
  Open open_ = Open::none;
  std::string open_id_, open_text_;
  bool incomplete_ = false;
};

}  // namespace

ResponsesRequest parse_responses_request(std::string_view text) {
  const json::object body = parse_object_body(text);
  reject_unknown_fields(body, BodyKind::responses);
  ResponsesRequest out;
  out.request = decode(body, out.echo);
  return out;
}

std::unique_ptr<CompletionWriter> make_responses_writer(std::string model, json::object echo) {
  return std::make_unique<ResponsesWriter>(std::move(model), std::move(echo));
}

}  // namespace tierlm::server
