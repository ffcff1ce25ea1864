// Small checked accessors over Boost.JSON for the tokenizer loader: every failure throws TokenizerError naming the
// JSON path (e.g. "pre_tokenizer.pretokenizers[1].pattern"), never asserts.
#pragma once

#include <boost/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "runtime/tokenizer/tokenizer_error.h"

namespace tierlm::tok::detail {

[[noreturn]] inline void json_fail(const std::string& where, const std::string& what) {
  throw TokenizerError(where + ": " + what);
}

inline const boost::json::object& json_object(const boost::json::value& v, const std::string& where) {
  if (!v.is_object()) json_fail(where, "expected an object");
  return v.get_object();
}

inline const boost::json::array& json_array(const boost::json::value& v, const std::string& where) {
  if (!v.is_array()) json_fail(where, "expected an array");
  return v.get_array();
}

inline std::string json_string(const boost::json::value& v, const std::string& where) {
  if (!v.is_string()) json_fail(where, "expected a string");
  return std::string(v.get_string());
}

// The member's value, or nullptr when absent or null.
inline const boost::json::value* json_find(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return (v == nullptr || v->is_null()) ? nullptr : v;
}

inline std::string json_required_string(const boost::json::object& o, std::string_view key,
                                        const std::string& where) {
  const auto* v = json_find(o, key);
  if (v == nullptr) json_fail(where, "missing '" + std::string(key) + "'");
  return json_string(*v, where + "." + std::string(key));
}

inline std::optional<std::string> json_optional_string(const boost::json::object& o, std::string_view key,
                                                       const std::string& where) {
  const auto* v = json_find(o, key);
  if (v == nullptr) return std::nullopt;
  return json_string(*v, where + "." + std::string(key));
}

inline bool json_bool(const boost::json::object& o, std::string_view key, bool fallback, const std::string& where) {
  const auto* v = json_find(o, key);
  if (v == nullptr) return fallback;
  if (!v->is_bool()) json_fail(where + "." + std::string(key), "expected a boolean");
  return v->get_bool();
}

inline long long json_integer(const boost::json::value& v, const std::string& where) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<unsigned long long>(INT64_MAX))
    return static_cast<long long>(v.get_uint64());
  json_fail(where, "expected an integer");
}

inline long long json_required_integer(const boost::json::object& o, std::string_view key, const std::string& where) {
  const auto* v = json_find(o, key);
  if (v == nullptr) json_fail(where, "missing '" + std::string(key) + "'");
  return json_integer(*v, where + "." + std::string(key));
}

// HF patterns are {"String": "..."} or {"Regex": "..."}.
struct JsonPattern {
  bool is_regex = false;
  std::string text;
};
inline JsonPattern json_pattern(const boost::json::value& v, const std::string& where) {
  const auto& o = json_object(v, where);
  if (const auto* s = json_find(o, "String")) return {false, json_string(*s, where + ".String")};
  if (const auto* r = json_find(o, "Regex")) return {true, json_string(*r, where + ".Regex")};
  json_fail(where, "expected {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace tierlm::tok::detail
