// server/chat_prompt.h — turns OpenAI chat messages into the prompt text the model was trained on.
// The model's own chat_template (tokenizer_config.json "chat_template", or chat_template.jinja; or a file given with
// --chat-template) is meant to be rendered by runtime/template. Until that interpreter is in the tree, a clearly
// marked MINIMAL FALLBACK renders ChatML (<|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n), which
// is what the tierlm-tiny test model's special tokens expect; it ignores tools and any real template.
// Never: guesses a format silently — description() says which renderer is active and /health reports it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/value.hpp>

namespace tierlm::tok {
class Tokenizer;
}

namespace tierlm::server {

class ChatPrompt {
 public:
  // Reads the template source (override file first, then the model folder); throws std::runtime_error when a given
  // override file cannot be read.
  static ChatPrompt load(const std::filesystem::path& model_dir, const std::optional<std::filesystem::path>& override_file,
                         const tok::Tokenizer& tokenizer);

  // Renders messages (as normalized by parse_completion_request) with add_generation_prompt = true.
  // Throws ApiError(400) when the template rejects the conversation.
  std::string render(const boost::json::array& messages, const boost::json::value& tools) const;

  // Token strings that end an assistant turn in this format (added to the stop tokens), e.g. "<|im_end|>".
  const std::vector<std::string>& end_of_turn_tokens() const { return end_of_turn_; }
  bool is_fallback() const { return fallback_; }
  std::string description() const { return description_; }

 private:
  std::string source_;          // the template text, empty when the model has none
  bool fallback_ = true;
  std::string description_;
  std::vector<std::string> end_of_turn_;
};

}  // namespace tierlm::server
