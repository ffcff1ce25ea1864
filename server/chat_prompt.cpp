#include "server/chat_prompt.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/tokenizer/tokenizer.h"
#include "server/api_error.h"

namespace tierlm::server {

namespace json = boost::json;

namespace {
std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string template_from_model(const std::filesystem::path& dir) {
  if (auto jinja = read_file(dir / "chat_template.jinja")) return *jinja;
  if (auto config = read_file(dir / "tokenizer_config.json")) {
    boost::system::error_code ec;
    json::value v = json::parse(*config, ec);
    if (!ec && v.is_object())
      if (auto* t = v.get_object().if_contains("chat_template"); t && t->is_string()) return std::string(t->get_string());
  }
  return {};
}
}  // namespace

ChatPrompt ChatPrompt::load(const std::filesystem::path& model_dir,
                            const std::optional<std::filesystem::path>& override_file, const tok::Tokenizer& tokenizer) {
  ChatPrompt p;
  if (override_file) {
    auto text = read_file(*override_file);
    if (!text) throw std::runtime_error("cannot read the chat template file " + override_file->string());
    p.source_ = *text;
  } else {
    p.source_ = template_from_model(model_dir);
  }
  // TEMPORARY (until runtime/template lands): every model gets the ChatML fallback.
  p.fallback_ = true;
  p.description_ = p.source_.empty()
      ? "minimal ChatML fallback (the model has no chat_template)"
      : "minimal ChatML fallback (the model's chat_template is not rendered yet: runtime/template is pending)";
  if (!p.source_.empty()) spdlog::warn("[server] chat template present but not rendered: {}", p.description_);
  if (tokenizer.token_to_id("<|im_end|>") >= 0) p.end_of_turn_.push_back("<|im_end|>");
  return p;
}

std::string ChatPrompt::render(const json::array& messages, const json::value& /*tools*/) const {
  // MINIMAL FALLBACK: ChatML, tools ignored; only for the test model until the template interpreter is integrated.
  std::string out;
  for (const auto& m : messages) {
    const auto& o = m.as_object();
    out += "<|im_start|>";
    out += o.at("role").as_string();
    out += "\n";
    out += o.at("content").as_string();
    out += "<|im_end|>\n";
  }
  out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace tierlm::server
