// Chat templates: the public face of runtime/template. ChatTemplate parses a model's Jinja chat_template once
// (any syntax error, unknown filter/test or unsupported construct is a TemplateError at load) and renders
// conversations byte-identical to transformers' apply_chat_template (jinja2 ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now, and its tojson). It never aborts:
// hostile templates hit RenderLimits and raise TemplateError.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "runtime/template/interpreter.h"
#include "runtime/template/template_error.h"

namespace tierlm::tmpl {

struct TemplateLimits {
  ParseLimits parse;
  RenderLimits render;
};

class ChatTemplate {
 public:
  static ChatTemplate parse(std::string source, const TemplateLimits& limits = {});

  // Renders with exactly the variables in `context` (JSON values become Python-like values).
  std::string render(const boost::json::object& context) const;

  const std::string& source() const { return parsed_->source; }

 private:
  std::shared_ptr<const ParsedTemplate> parsed_;
  TemplateLimits limits_;
};

// What transformers passes besides the conversation: messages, tools (null when absent), documents (null),
// add_generation_prompt, the special tokens and any extra keyword (e.g. enable_thinking).
std::string render_chat(const ChatTemplate& chat_template, const boost::json::array& messages,
                        bool add_generation_prompt, const boost::json::value& tools,
                        const boost::json::object& special_tokens, const boost::json::object& extra = {});

// A model folder's templates: chat_template.jinja, else chat_template.json, else tokenizer_config.json's
// "chat_template" (a string, or a list of {name, template}); plus tokenizer_config's special tokens as strings.
struct ModelChatTemplates {
  std::map<std::string, ChatTemplate> named;  // "default" for a single template
  boost::json::object special_tokens;         // bos_token, eos_token, ..., additional_special_tokens
  bool empty() const { return named.empty(); }
  // transformers' choice: the named one if given, else "tool_use" when tools are passed and it exists, else
  // "default". Throws TemplateError if there is none.
  const ChatTemplate& select(bool has_tools, std::string_view name = {}) const;
};

ModelChatTemplates load_chat_templates(const std::filesystem::path& model_dir, const TemplateLimits& limits = {});

// Special tokens of a tokenizer_config.json object, as transformers' special_tokens_map exposes them.
boost::json::object special_tokens_from_config(const boost::json::object& tokenizer_config);

}  // namespace tierlm::tmpl
