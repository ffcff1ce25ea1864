#include "server/assistant_output.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <utility>

#include <boost/json.hpp>

#include "server/tool_call_formats.h"

namespace tierlm::server {

namespace json = boost::json;

const char* to_string(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::none: return "none";
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::qwen_xml: return "qwen_xml";
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::mistral: return "mistral";
    case ToolCallFormat::gemma4: return "gemma4";
    case ToolCallFormat::harmony: return "harmony";
    case ToolCallFormat::deepseek_v3: return "deepseek_v3";
  }
  return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view src) {
  auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|channel|>") && has("<|message|>")) return ToolCallFormat::harmony;
  if (has("<｜tool▁calls▁begin｜>")) return ToolCallFormat::deepseek_v3;
  if (has("<|tool_call>")) return ToolCallFormat::gemma4;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::mistral;
  if (has("<function=") && has("<parameter=")) return ToolCallFormat::qwen_xml;
  if (has("<tool_call>")) return ToolCallFormat::hermes;
  if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("ipython"))) return ToolCallFormat::llama3_json;
  return ToolCallFormat::none;
}

bool needs_special_tokens(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::mistral:
    case ToolCallFormat::gemma4:
    case ToolCallFormat::harmony:
    case ToolCallFormat::deepseek_v3:
    case ToolCallFormat::llama3_json: return true;
    default: return false;
  }
}

void AssistantDelta::append(AssistantDelta&& other) {
  reasoning += other.reasoning;
  content += other.content;
  for (auto& c : other.tool_calls) tool_calls.push_back(std::move(c));
}

namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool all_space(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

// Length of the longest suffix of `text` that is a proper prefix of `marker`: text that may become the marker.
size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// `<think>...</think>` at the start of the output (or the whole output when the prompt opened it).
class ThinkSplitter {
 public:
  explicit ThinkSplitter(bool starts_inside) : state_(starts_inside ? State::reasoning : State::start) {}

  void push(std::string_view text, std::string& reasoning, std::string& content) {
    buf_ += text;
    for (;;) {
      if (state_ == State::start) {
        const size_t p = buf_.find_first_not_of(" \t\r\n");
        if (p == std::string::npos) return;
        const std::string_view rest = std::string_view(buf_).substr(p);
        if (rest.starts_with(kOpen)) {
          buf_.erase(0, p + kOpen.size());
          state_ = State::reasoning;
          continue;
        }
        if (kOpen.starts_with(rest)) return;
        state_ = State::content;
        continue;
      }
      if (state_ == State::reasoning) {
        const size_t q = buf_.find(kClose);
        if (q == std::string::npos) {
          const size_t hold = partial_suffix(buf_, kClose);
          reasoning.append(buf_, 0, buf_.size() - hold);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        reasoning.append(buf_, 0, q);
        buf_.erase(0, q + kClose.size());
        state_ = State::after;
        continue;
      }
      if (state_ == State::after) {  // the blank lines between </think> and the answer belong to neither
        const size_t p = buf_.find_first_not_of(" \t\r\n");
        if (p == std::string::npos) return;
        buf_.erase(0, p);
        state_ = State::content;
        continue;
      }
      content += buf_;
      buf_.clear();
      return;
    }
  }

  void finish(std::string& reasoning, std::string& content) {
    if (state_ == State::reasoning) reasoning += buf_;
    else if (state_ != State::after) content += buf_;
    buf_.clear();
  }

 private:
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  enum class State { start, reasoning, after, content } state_;
  std::string buf_;
};

// Finds a format's tool-call blocks in the content stream.
class BlockScanner {
 public:
  BlockScanner(ToolCallFormat format, const json::array& tools)
      : format_(format), markers_(toolfmt::block_markers(format)), tools_(tools) {}

  void push(std::string_view text, AssistantDelta& out) {
    buf_ += text;
    for (;;) {
      if (!in_block_) {
        size_t best = std::string::npos, which = 0, hold = 0;
        for (size_t m = 0; m < markers_.size(); ++m) {
          const auto& mk = markers_[m];
          if (mk.at_start_only) {
            if (started_) continue;
            const size_t p = buf_.find_first_not_of(" \t\r\n");
            if (p == std::string::npos) {
              hold = buf_.size();
              continue;
            }
            if (std::string_view(buf_).substr(p).starts_with(mk.open) && p < best) best = p, which = m;
            continue;
          }
          const size_t p = buf_.find(mk.open);
          if (p != std::string::npos && p < best) best = p, which = m;
          hold = std::max(hold, partial_suffix(buf_, mk.open));
        }
        if (best == std::string::npos) {
          emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        emit_content(std::string_view(buf_).substr(0, best), out);
        // Whitespace just before a block separates it; it is content again only if the block is not a call.
        space_before_block_ = std::exchange(held_space_, {});
        buf_.erase(0, best + markers_[which].open.size());
        in_block_ = true;
        marker_ = which;
        started_ = true;
        continue;
      }
      const auto& mk = markers_[marker_];
      if (mk.close.empty()) return;  // runs to the end of the output
      const size_t q = buf_.find(mk.close);
      if (q == std::string::npos) return;
      close_block(std::string_view(buf_).substr(0, q), true, out);
      buf_.erase(0, q + mk.close.size());
      in_block_ = false;
    }
  }

  void finish(AssistantDelta& out) {
    if (in_block_) close_block(buf_, false, out);
    else emit_content(buf_, out);
    buf_.clear();
    in_block_ = false;
    if (!made_call_) out.content += held_space_;
    held_space_.clear();
  }

 private:
  void close_block(std::string_view body, bool closed, AssistantDelta& out) {
    const auto& mk = markers_[marker_];
    auto calls = toolfmt::parse_block(format_, mk, body, tools_);
    if (!calls) {
      std::string raw = std::exchange(space_before_block_, {});
      raw += mk.open;
      raw += body;
      if (closed) raw += mk.close;
      emit_content(raw, out);
      return;
    }
    for (auto& c : *calls) out.tool_calls.push_back(ToolCall{{}, std::move(c.name), std::move(c.arguments)});
    made_call_ = true;
    held_space_.clear();
    space_before_block_.clear();
  }

  // Trailing whitespace is held until something follows it: after a tool call, or at the very end, it is dropped
  // when calls were made, so the answer does not depend on where the text was split.
  void emit_content(std::string_view s, AssistantDelta& out) {
    if (s.empty()) return;
    if (all_space(s)) {
      held_space_ += s;
      return;
    }
    size_t k = s.size();
    while (k > 0 && is_space(s[k - 1])) --k;
    out.content += held_space_;
    held_space_.clear();
    out.content += s.substr(0, k);
    held_space_ = std::string(s.substr(k));
    started_ = true;
  }

  ToolCallFormat format_;
  std::vector<toolfmt::BlockMarker> markers_;
  const json::array& tools_;
  std::string buf_, held_space_, space_before_block_;
  bool in_block_ = false, started_ = false, made_call_ = false;
  size_t marker_ = 0;
};

// gpt-oss harmony: messages `[<|start|>assistant]<|channel|>CH[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY`
// ending in <|end|>, <|call|>, <|return|> or the next message. analysis -> reasoning, final / commentary -> content,
// a functions.NAME recipient -> a tool call whose arguments are the body.
class HarmonyParser {
 public:
  void push(std::string_view text, AssistantDelta& out) {
    buf_ += text;
    for (;;) {
      if (!in_body_) {
        const size_t m = buf_.find(kMessage);
        if (m != std::string::npos && m <= kMaxHeader) {
          begin_message(std::string_view(buf_).substr(0, m));
          buf_.erase(0, m + kMessage.size());
          in_body_ = true;
          continue;
        }
        if (buf_.size() <= kMaxHeader && m == std::string::npos) return;
        kind_ = Kind::content;  // not a header: plain text
        in_body_ = true;
        plain_ = true;
        continue;
      }
      size_t best = std::string::npos, which = 0, hold = 0;
      for (size_t t = 0; t < std::size(kTerminators); ++t) {
        const size_t p = buf_.find(kTerminators[t]);
        if (p != std::string::npos && p < best) best = p, which = t;
        hold = std::max(hold, partial_suffix(buf_, kTerminators[t]));
      }
      if (best == 0 && plain_) {
        // Text that is not a message: a marker where no header follows is text too (and the parser moves on).
        deliver(kTerminators[which], out);
        buf_.erase(0, kTerminators[which].size());
        continue;
      }
      if (best == std::string::npos) {
        if (buf_.size() > hold) plain_ = false;
        deliver(std::string_view(buf_).substr(0, buf_.size() - hold), out);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      plain_ = false;
      deliver(std::string_view(buf_).substr(0, best), out);
      end_message(out);
      // <|end|>, <|call|> and <|return|> close a message; <|start|> and <|channel|> begin the next header.
      buf_.erase(0, best + (which < 3 ? kTerminators[which].size() : 0));
      in_body_ = false;
    }
  }

  void finish(AssistantDelta& out) {
    if (in_body_) {
      deliver(buf_, out);
      end_message(out);
    } else if (!all_space(buf_)) {
      out.content += buf_;
    }
    buf_.clear();
    in_body_ = false;
  }

 private:
  enum class Kind { reasoning, content, tool };
  static constexpr size_t kMaxHeader = 512;
  static constexpr std::string_view kMessage = "<|message|>";
  static constexpr std::string_view kTerminators[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>",
                                                      "<|channel|>"};

  static std::string_view word_after(std::string_view header, std::string_view key) {
    const size_t p = header.find(key);
    if (p == std::string_view::npos) return {};
    std::string_view rest = header.substr(p + key.size());
    size_t n = 0;
    while (n < rest.size() && !is_space(rest[n]) && rest[n] != '<') ++n;
    return rest.substr(0, n);
  }

  void begin_message(std::string_view header) {
    const std::string_view channel = word_after(header, "<|channel|>");
    const std::string_view recipient = word_after(header, "to=");
    tool_body_.clear();
    raw_header_ = std::string(header) + std::string(kMessage);
    if (!recipient.empty()) {
      kind_ = Kind::tool;
      tool_name_ = std::string(recipient.starts_with("functions.") ? recipient.substr(10) : recipient);
    } else if (channel == "analysis") {
      kind_ = Kind::reasoning;
    } else {
      kind_ = Kind::content;
    }
  }

  void deliver(std::string_view text, AssistantDelta& out) {
    switch (kind_) {
      case Kind::reasoning: out.reasoning += text; break;
      case Kind::content: out.content += text; break;
      case Kind::tool: tool_body_ += text; break;
    }
  }

  void end_message(AssistantDelta& out) {
    if (kind_ != Kind::tool) return;
    boost::system::error_code ec;
    json::value v = json::parse(tool_body_, ec);
    if (!ec && v.is_object() && !tool_name_.empty()) {
      out.tool_calls.push_back(ToolCall{{}, tool_name_, json::serialize(v)});
    } else {
      out.content += raw_header_ + tool_body_;
    }
    tool_body_.clear();
    kind_ = Kind::content;
  }

  std::string buf_, tool_body_, tool_name_, raw_header_;
  bool in_body_ = false;
  bool plain_ = false;  // in text that failed to be a header: a marker at its very start is text
  Kind kind_ = Kind::content;
};

}  // namespace

struct AssistantOutputParser::Impl {
  AssistantOutputOptions options;
  int next_call = 0;
  std::optional<ThinkSplitter> think;
  std::optional<BlockScanner> scanner;
  std::optional<HarmonyParser> harmony;

  explicit Impl(AssistantOutputOptions o) : options(std::move(o)) {
    if (options.format == ToolCallFormat::harmony) {
      harmony.emplace();
      return;
    }
    if (options.split_reasoning) think.emplace(options.starts_in_reasoning);
    if (options.parse_tool_calls && options.format != ToolCallFormat::none)
      scanner.emplace(options.format, options.tools);
  }

  void number(AssistantDelta& out) {
    for (auto& c : out.tool_calls)
      if (c.id.empty()) c.id = options.id_prefix + std::to_string(next_call++);
    if (!options.parse_tool_calls && !out.tool_calls.empty()) {  // harmony with tools off: calls are text
      for (auto& c : out.tool_calls) out.content += c.arguments;
      out.tool_calls.clear();
    }
  }

  void feed(std::string_view text, bool last, AssistantDelta& out) {
    if (harmony) {
      if (!text.empty()) harmony->push(text, out);
      if (last) harmony->finish(out);
      number(out);
      return;
    }
    std::string content;
    if (think) {
      if (!text.empty()) think->push(text, out.reasoning, content);
      if (last) think->finish(out.reasoning, content);
    } else {
      content = std::string(text);
    }
    if (scanner) {
      if (!content.empty()) scanner->push(content, out);
      if (last) scanner->finish(out);
    } else {
      out.content += content;
    }
    number(out);
  }
};

AssistantOutputParser::AssistantOutputParser(AssistantOutputOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
AssistantOutputParser::~AssistantOutputParser() = default;
AssistantOutputParser::AssistantOutputParser(AssistantOutputParser&&) noexcept = default;
AssistantOutputParser& AssistantOutputParser::operator=(AssistantOutputParser&&) noexcept = default;

AssistantDelta AssistantOutputParser::push(std::string_view text) {
  AssistantDelta out;
  impl_->feed(text, false, out);
  return out;
}

AssistantDelta AssistantOutputParser::finish() {
  AssistantDelta out;
  impl_->feed({}, true, out);
  return out;
}

AssistantDelta AssistantOutputParser::parse(std::string_view text, const AssistantOutputOptions& options) {
  AssistantOutputParser p(options);
  AssistantDelta out = p.push(text);
  out.append(p.finish());
  return out;
}

}  // namespace tierlm::server
