// TemplateError: every failure of the chat-template interpreter, at parse time (syntax, unsupported feature, limits)
// or render time (raise_exception, undefined use, type errors). Never an abort: hostile templates end here.
#pragma once

#include <cstdint>
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

// Integer arithmetic as Python would do it, within 64 bits: Python's ints never overflow, ours throw a
// TemplateError where the exact result does not fit (a hostile template must not reach signed overflow).
inline int64_t int_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw TemplateError("integer result overflows 64 bits");
  return r;
}
inline int64_t int_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) throw TemplateError("integer result overflows 64 bits");
  return r;
}
inline int64_t int_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw TemplateError("integer result overflows 64 bits");
  return r;
}
inline int64_t int_neg(int64_t a) { return int_sub(0, a); }

// A double converted to an integer the way int() truncates; outside the 64-bit range it is an error, not UB.
inline int64_t int_from_double(double d) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) throw TemplateError("float too large to convert to a 64-bit integer");
  return static_cast<int64_t>(d);
}

}  // namespace tierlm::tmpl
