#include "server/tool_choice_constraint.h"

#include <boost/json.hpp>
#include <fmt/format.h>

#include "server/api_error.h"

namespace tierlm::server {

namespace json = boost::json;

namespace {

// hermes templates write the call either as Qwen's JSON object (`{"name": ...` in the template) or, without a JSON
// "name" key, as `<tool_call>NAME {args}</tool_call>`: the two bodies parse_hermes reads.
bool hermes_json_object(std::string_view template_source) {
  return template_source.find("\"name\"") != std::string_view::npos;
}

grammar::ToolCallForm name_first_tool_call(const std::string& name, const json::value& parameters) {
  return grammar::ToolCallForm{"<tool_call>" + name + " ", parameters, "</tool_call>"};
}

}  // namespace

ToolCallConstraintSpec tool_choice_spec(const CompletionRequest& req, ToolCallFormat format) {
  ToolCallConstraintSpec spec;
  spec.format = format;
  spec.parallel = req.parallel_tool_calls && req.tool_choice == ToolChoice::required;
  if (!req.tools.is_array()) return spec;
  for (const auto& tool : req.tools.get_array()) {
    const auto& fn = tool.at("function").as_object();
    const std::string name(fn.at("name").as_string());
    if (req.tool_choice == ToolChoice::function && name != req.tool_choice_name) continue;
    spec.names.push_back(name);
    const json::value* parameters = fn.if_contains("parameters");
    spec.parameters.push_back(parameters && parameters->is_object() ? parameters->get_object()
                                                                    : json::object{{"type", "object"}});
  }
  return spec;
}

std::string tool_choice_key(const ToolCallConstraintSpec& spec, std::string_view template_source) {
  json::array calls;
  for (size_t i = 0; i < spec.names.size(); ++i) calls.push_back(json::array{json::string(spec.names[i]), spec.parameters[i]});
  return fmt::format("tool_choice:{}:{}:{}:{}", to_string(spec.format),
                     hermes_json_object(template_source) ? "json" : "name_first", spec.parallel ? "parallel" : "one",
                     json::serialize(calls));
}

std::shared_ptr<const grammar::Grammar> compile_tool_choice(const ToolCallConstraintSpec& spec,
                                                            std::string_view template_source) {
  if (spec.format != ToolCallFormat::hermes)
    throw ApiError(400, fmt::format("tool_choice 'required' or a named function is constrained only for the "
                                    "<tool_call> (hermes) tool-call format; this model's chat template uses '{}'. "
                                    "Use tool_choice 'auto'.", to_string(spec.format)),
                   "invalid_request_error", "tool_choice", "unsupported_value");
  if (spec.names.empty())
    throw ApiError(400, "'tool_choice' allows no function among 'tools'.", "invalid_request_error", "tool_choice",
                   "invalid_value");
  const bool json_object = hermes_json_object(template_source);
  std::vector<grammar::ToolCallForm> forms;
  for (size_t i = 0; i < spec.names.size(); ++i)
    forms.push_back(json_object ? grammar::qwen_tool_call(spec.names[i], spec.parameters[i])
                                : name_first_tool_call(spec.names[i], spec.parameters[i]));
  try {
    return grammar::compile_tool_calls(forms, spec.parallel, "\n");
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, fmt::format("Invalid 'tools' parameters schema for tool_choice: {}", e.what()),
                   "invalid_request_error", "tools.function.parameters." + e.keyword(), "unsupported_schema");
  }
}

}  // namespace tierlm::server
