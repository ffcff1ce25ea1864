#include "server/json_fields.h"

#include <cmath>
#include <limits>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "server/api_error.h"

namespace tierlm::server::jsonf {

namespace json = boost::json;

[[noreturn]] void invalid(const std::string& param, const std::string& message, const std::string& code) {
  throw ApiError(400, message, "invalid_request_error", param, code);
}

const char* kind_of(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return "a boolean";
    case json::kind::int64:
    case json::kind::uint64: return "an integer";
    case json::kind::double_: return "a number";
    case json::kind::string: return "a string";
    case json::kind::array: return "an array";
    case json::kind::object: return "an object";
  }
  return "a value";
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json::value& v) {
  invalid(param, fmt::format("Invalid type for '{}': expected {}, but got {}.", param, expected, kind_of(v)),
          "invalid_type");
}

// A field that is absent or null counts as not given.
const json::value* field(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return (v && !v->is_null()) ? v : nullptr;
}

std::optional<double> number(const json::object& o, std::string_view key, double lo, double hi) {
  const json::value* v = field(o, key);
  if (!v) return std::nullopt;
  double x;
  if (v->is_double()) x = v->get_double();
  else if (v->is_int64()) x = double(v->get_int64());
  else if (v->is_uint64()) x = double(v->get_uint64());
  else wrong_type(std::string(key), "a number", *v);
  if (!std::isfinite(x) || x < lo || x > hi)
    invalid(std::string(key), fmt::format("'{}' must be between {} and {}, got {}.", key, lo, hi, x));
  return x;
}

std::optional<int64_t> integer(const json::object& o, std::string_view key, int64_t lo, int64_t hi) {
  const json::value* v = field(o, key);
  if (!v) return std::nullopt;
  int64_t x;
  if (v->is_int64()) x = v->get_int64();
  else if (v->is_uint64()) {
    if (v->get_uint64() > uint64_t(std::numeric_limits<int64_t>::max()))
      invalid(std::string(key), fmt::format("'{}' is too large.", key));
    x = int64_t(v->get_uint64());
  } else if (v->is_double() && std::floor(v->get_double()) == v->get_double() && std::abs(v->get_double()) < 9e15) {
    x = int64_t(v->get_double());  // 5.0 is an integer to JavaScript clients
  } else {
    wrong_type(std::string(key), "an integer", *v);
  }
  if (x < lo || x > hi) invalid(std::string(key), fmt::format("'{}' must be between {} and {}, got {}.", key, lo, hi, x));
  return x;
}

std::optional<bool> boolean(const json::object& o, std::string_view key) {
  const json::value* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_bool()) wrong_type(std::string(key), "a boolean", *v);
  return v->get_bool();
}

std::optional<std::string> string(const json::object& o, std::string_view key, const std::string& param) {
  const json::value* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(param, "a string", *v);
  return std::string(v->get_string());
}

void missing(const std::string& param) {
  invalid(param, fmt::format("Missing required parameter: '{}'.", param), "missing_required_parameter");
}

std::string required_string(const json::object& o, std::string_view key, const std::string& param) {
  auto s = string(o, key, param);
  if (!s) missing(param);
  return *s;
}

const json::object& object_at(const json::value& v, const std::string& param) {
  if (!v.is_object()) wrong_type(param, "an object", v);
  return v.get_object();
}

json::object parse_object_body(std::string_view text) {
  boost::system::error_code ec;
  json::value doc = json::parse(text, ec);
  if (ec)
    throw ApiError(400, fmt::format("The request body is not valid JSON ({}).", ec.message()), "invalid_request_error",
                   {}, "invalid_json");
  if (!doc.is_object())
    throw ApiError(400, fmt::format("The request body must be a JSON object, got {}.", kind_of(doc)),
                   "invalid_request_error", {}, "invalid_json");
  return std::move(doc.get_object());
}

}  // namespace tierlm::server::jsonf
