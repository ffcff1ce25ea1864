// server/json_fields.h — typed reads of a request body's fields with OpenAI-style 400s naming the parameter
// (wrong type, out of range, missing), shared by the OpenAI, Anthropic and Responses decoders. A field that is absent or null
// counts as not given. Never: accepts a value of the wrong type silently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

namespace tierlm::server::jsonf {

[[noreturn]] void invalid(const std::string& param, const std::string& message,
                          const std::string& code = "invalid_value");
const char* kind_of(const boost::json::value& v);
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const boost::json::value& v);
[[noreturn]] void missing(const std::string& param);
const boost::json::value* field(const boost::json::object& o, std::string_view key);
std::optional<double> number(const boost::json::object& o, std::string_view key, double lo, double hi);
std::optional<int64_t> integer(const boost::json::object& o, std::string_view key, int64_t lo, int64_t hi);
std::optional<bool> boolean(const boost::json::object& o, std::string_view key);
std::optional<std::string> string(const boost::json::object& o, std::string_view key, const std::string& param);
// A present string field, else a 400 naming `param` as missing.
std::string required_string(const boost::json::object& o, std::string_view key, const std::string& param);
// `v` as an object, else a 400 naming `param`.
const boost::json::object& object_at(const boost::json::value& v, const std::string& param);
// A request body: a JSON object, else a 400 (invalid_json).
boost::json::object parse_object_body(std::string_view text);

}  // namespace tierlm::server::jsonf
