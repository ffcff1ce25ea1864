#include "server/chat_prompt.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/template/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/api_error.h"

namespace tierlm::server {

ChatPrompt ChatPrompt::load(const std::filesystem::path& model_dir,
                            const std::optional<std::filesystem::path>& override_file, const tok::Tokenizer& tokenizer) {
  ChatPrompt p;
  p.templates_ = std::make_shared<tmpl::ModelChatTemplates>(tmpl::load_chat_templates(model_dir));
  if (override_file) {
    std::ifstream in(*override_file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the chat template file " + override_file->string());
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      p.override_ = std::make_shared<tmpl::ChatTemplate>(tmpl::ChatTemplate::parse(ss.str()));
    } catch (const tmpl::TemplateError& e) {
      throw tmpl::TemplateError(e.message() + " (in " + override_file->string() + ")", e.line(), e.column());
    }
    p.has_template_ = true;
    p.description_ = "chat template from " + override_file->string();
  } else if (!p.templates_->empty()) {
    p.has_template_ = true;
    p.description_ = "the model's chat template";
    if (p.templates_->named.size() > 1) p.description_ += "s (" + std::to_string(p.templates_->named.size()) + " named)";
  } else {
    p.description_ = "none (the model has no chat_template; pass --chat-template FILE)";
    spdlog::warn("[server] {} has no chat template: /v1/chat/completions will answer 400 until --chat-template is given",
                 model_dir.string());
  }
  if (p.has_template_) {
    try {
      const tmpl::ChatTemplate& t = p.override_ ? *p.override_ : p.templates_->select(/*has_tools=*/true);
      p.tool_call_format_ = detect_tool_call_format(t.source());
      p.tool_template_source_ = t.source();
      p.has_reasoning_ =
          t.source().find("<think>") != std::string::npos || p.tool_call_format_ == ToolCallFormat::harmony;
    } catch (const tmpl::TemplateError&) {
      // only named templates and none is "default": requests will say so; nothing to detect here
    }
    spdlog::info("[server] chat output: tool calls as {}, reasoning {}", to_string(p.tool_call_format_),
                 p.has_reasoning_ ? "split out" : "none");
  }
  // harmony's <|end|> closes the analysis message, not the turn (its turn ends are the eos <|return|> / <|call|>).
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end_of_text|>", "<|end|>"})
    if (tokenizer.token_to_id(t) >= 0 && !(p.tool_call_format_ == ToolCallFormat::harmony && std::string(t) == "<|end|>"))
      p.end_of_turn_.push_back(t);
  return p;
}

std::string ChatPrompt::render(const boost::json::array& messages, const boost::json::value& tools,
                               const boost::json::object& extra) const {
  if (!has_template_)
    throw ApiError(400, "This model has no chat template, so chat messages cannot be turned into a prompt. Use "
                        "/v1/completions, or start the server with --chat-template FILE.",
                   "invalid_request_error", "messages", "no_chat_template");
  const bool has_tools = tools.is_array() && !tools.as_array().empty();
  try {
    const tmpl::ChatTemplate& t = override_ ? *override_ : templates_->select(has_tools);
    return tmpl::render_chat(t, messages, /*add_generation_prompt=*/true, has_tools ? tools : boost::json::value(nullptr),
                             templates_->special_tokens, extra);
  } catch (const tmpl::TemplateError& e) {
    // raise_exception in a template is how models reject a conversation (roles must alternate, ...).
    throw ApiError(400, "The chat template rejected these messages: " + e.message(), "invalid_request_error",
                   "messages", "chat_template_error");
  }
}

}  // namespace tierlm::server
