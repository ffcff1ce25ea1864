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

std::string quoted(const std::string& name) { return json::serialize(json::value(json::string(name))); }

// Llama-3.1/3.2/3.3 templates render a call as {"name": "NAME", "parameters": ARGS} (tojson's ", " and ": ").
grammar::ToolCallForm llama3_tool_call(const std::string& name, const json::value& parameters) {
  return grammar::ToolCallForm{"{\"name\": " + quoted(name) + ", \"parameters\": ", parameters, "}"};
}

// Mistral v11+ templates: [TOOL_CALLS]NAME[ARGS]{...}; v3: [TOOL_CALLS][{"name": "NAME", "arguments": {...}}].
bool mistral_args_marker(std::string_view template_source) {
  return template_source.find("[ARGS]") != std::string_view::npos;
}

grammar::ToolCallForm mistral_tool_call(const std::string& name, const json::value& parameters, bool args_marker) {
  if (args_marker) return grammar::ToolCallForm{"[TOOL_CALLS]" + name + "[ARGS]", parameters, ""};
  return grammar::ToolCallForm{"[TOOL_CALLS][{\"name\": " + quoted(name) + ", \"arguments\": ", parameters, "}]"};
}

// The variant of the format's syntax a template teaches (part of the grammar cache key).
const char* syntax_of(ToolCallFormat format, std::string_view template_source) {
  switch (format) {
    case ToolCallFormat::hermes: return hermes_json_object(template_source) ? "json" : "name_first";
    case ToolCallFormat::mistral: return mistral_args_marker(template_source) ? "args_marker" : "json_array";
    default: return "json";
  }
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
  return fmt::format("tool_choice:{}:{}:{}:{}", to_string(spec.format), syntax_of(spec.format, template_source),
                     spec.parallel ? "parallel" : "one", json::serialize(calls));
}

std::vector<std::string> tool_choice_markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::hermes: return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::mistral: return {"[TOOL_CALLS]", "[ARGS]"};
    default: return {};
  }
}

std::shared_ptr<const grammar::Grammar> compile_tool_choice(const ToolCallConstraintSpec& spec,
                                                            std::string_view template_source) {
  if (spec.format != ToolCallFormat::hermes && spec.format != ToolCallFormat::llama3_json &&
      spec.format != ToolCallFormat::mistral)
    throw ApiError(400, fmt::format("tool_choice 'required' or a named function is constrained for the <tool_call> "
                                    "(hermes), Llama-3 JSON and Mistral [TOOL_CALLS] tool-call formats; this model's "
                                    "chat template uses '{}'{}. Use tool_choice 'auto'.", to_string(spec.format),
                                    spec.format == ToolCallFormat::qwen_xml
                                        ? " (its parameter values are raw text between XML tags, which the grammar "
                                          "engine does not express)"
                                        : ""),
                   "invalid_request_error", "tool_choice", "unsupported_value");
  if (spec.names.empty())
    throw ApiError(400, "'tool_choice' allows no function among 'tools'.", "invalid_request_error", "tool_choice",
                   "invalid_value");
  std::vector<grammar::ToolCallForm> forms;
  for (size_t i = 0; i < spec.names.size(); ++i) {
    switch (spec.format) {
      case ToolCallFormat::llama3_json: forms.push_back(llama3_tool_call(spec.names[i], spec.parameters[i])); break;
      case ToolCallFormat::mistral:
        forms.push_back(mistral_tool_call(spec.names[i], spec.parameters[i], mistral_args_marker(template_source)));
        break;
      default:
        forms.push_back(hermes_json_object(template_source) ? grammar::qwen_tool_call(spec.names[i], spec.parameters[i])
                                                            : name_first_tool_call(spec.names[i], spec.parameters[i]));
    }
  }
  for (const auto& marker : spec.special_markers)
    for (const auto& form : forms)
      if (form.prefix.find(marker) != std::string::npos || form.suffix.find(marker) != std::string::npos)
        throw ApiError(400, fmt::format("tool_choice 'required' or a named function cannot be enforced here: the "
                                        "call marker '{}' is a special token of this model's tokenizer, and "
                                        "constrained decoding writes ordinary tokens only. Use tool_choice 'auto'.",
                                        marker),
                       "invalid_request_error", "tool_choice", "unsupported_value");
  // Llama-3 and Mistral templates write one call per turn.
  const bool parallel = spec.parallel && spec.format == ToolCallFormat::hermes;
  try {
    return grammar::compile_tool_calls(forms, parallel, "\n");
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, fmt::format("Invalid 'tools' parameters schema for tool_choice: {}", e.what()),
                   "invalid_request_error", "tools.function.parameters." + e.keyword(), "unsupported_schema");
  }
}

}  // namespace tierlm::server
