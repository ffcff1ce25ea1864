// server/chat_prompt.h — turns OpenAI chat messages into the prompt text the model was trained on, by rendering the
// model's own chat template with runtime/template (byte-identical to transformers' apply_chat_template): the
// folder's chat_template.jinja / chat_template.json / tokenizer_config.json "chat_template", or a file given with
// --chat-template. A template that does not parse is an error at load; a model without any template still serves
// /v1/completions, and /v1/chat/completions answers 400 saying how to supply one.
// Never: guesses a prompt format.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/assistant_output.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

namespace tierlm::tok {
class Tokenizer;
}
namespace tierlm::tmpl {
struct ModelChatTemplates;
class ChatTemplate;
}  // namespace tierlm::tmpl

namespace tierlm::server {

class ChatPrompt {
 public:
  // Throws tmpl::TemplateError (naming the file and line) when a template cannot be parsed, std::runtime_error
  // when the override file cannot be read.
  static ChatPrompt load(const std::filesystem::path& model_dir, const std::optional<std::filesystem::path>& override_file,
                         const tok::Tokenizer& tokenizer);

  // Renders messages (as normalized by parse_completion_request) with add_generation_prompt = true; tools select
  // the "tool_use" template when the model has one. Throws ApiError(400) when there is no template or the template
  // rejects the conversation (raise_exception), with the template's message.
  // extra: further template variables (chat_template_kwargs, reasoning_effort).
  std::string render(const boost::json::array& messages, const boost::json::value& tools,
                     const boost::json::object& extra = {}) const;
  // The tool-call wire format the template teaches (from its source; the tool_use template's when there is one),
  // and whether it has thinking blocks (<think> or harmony's analysis channel) to split from the answer.
  ToolCallFormat tool_call_format() const { return tool_call_format_; }
  bool has_reasoning() const { return has_reasoning_; }
  // The source of the template tool calls are rendered with: tool_choice's constraint writes calls its way.
  const std::string& tool_template_source() const { return tool_template_source_; }

  // Token strings that close an assistant turn in common formats and exist in this tokenizer (<|im_end|>,
  // <|eot_id|>, <end_of_turn>, <|end_of_text|>...), stop tokens for chat in addition to the model's eos ids.
  const std::vector<std::string>& end_of_turn_tokens() const { return end_of_turn_; }
  bool has_template() const { return has_template_; }
  std::string description() const { return description_; }

 private:
  std::shared_ptr<const tmpl::ModelChatTemplates> templates_;
  std::shared_ptr<const tmpl::ChatTemplate> override_;
  bool has_template_ = false;
  std::string description_;
  std::vector<std::string> end_of_turn_;
  ToolCallFormat tool_call_format_ = ToolCallFormat::none;
  std::string tool_template_source_;
  bool has_reasoning_ = false;
};

}  // namespace tierlm::server
