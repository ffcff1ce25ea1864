// TemplateError: every failure of the chat-template interpreter, at parse time (syntax, unsupported feature, limits)
// or render time (raise_exception, undefined use, type errors). Never an abort: hostile templates end here.
#pragma once

#include <stdexcept>
#include <string>

namespace tierlm::tmpl {

class TemplateError : public std::runtime_error {
 public:
  // `message` is what jinja2 would say (raise_exception's text verbatim); line/column are 1-based, 0 if unknown.
  TemplateError(std::string message, int line = 0, int column = 0)
      : std::runtime_error(format(message, line, column)), message_(std::move(message)), line_(line), column_(column) {}

  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  static std::string format(const std::string& message, int line, int column) {
    std::string out = "chat template";
    if (line > 0) {
      out += " line ";
      out += std::to_string(line);
      if (column > 0) {
        out += ':';
        out += std::to_string(column);
      }
    }
    out += ": ";
    out += message;
    return out;
  }
  std::string message_;
  int line_;
  int column_;
};

}  // namespace tierlm::tmpl
