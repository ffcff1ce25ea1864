// calibrate/json_fields.h — internal: typed reads of Boost.JSON objects that fail with the field's name, for the
// wisdom file, device profiles and plans. Never: used outside calibrate/.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <boost/json.hpp>

namespace tierlm::calibrate::json {

inline const boost::json::object& object(const boost::json::value& v, const std::string& what) {
  if (!v.is_object()) throw std::runtime_error(what + ": expected a JSON object");
  return v.get_object();
}

inline const boost::json::value& field(const boost::json::object& o, const char* name, const std::string& what) {
  const boost::json::value* v = o.if_contains(name);
  if (!v) throw std::runtime_error(what + ": missing field '" + name + "'");
  return *v;
}

// A value's number (what: where it is, for the message); throws instead of Boost.JSON's system_error.
inline double number_value(const boost::json::value& v, const std::string& what) {
  if (v.is_double()) return v.get_double();
  if (v.is_int64()) return double(v.get_int64());
  if (v.is_uint64()) return double(v.get_uint64());
  throw std::runtime_error(what + " must be a number");
}

inline int64_t integer_value(const boost::json::value& v, const std::string& what) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= uint64_t(INT64_MAX)) return int64_t(v.get_uint64());
  if (v.is_double() && v.get_double() == double(int64_t(v.get_double()))) return int64_t(v.get_double());
  throw std::runtime_error(what + " must be an integer");
}

inline uint64_t unsigned_value(const boost::json::value& v, const std::string& what) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return uint64_t(v.get_int64());
  if (v.is_double() && v.get_double() >= 0 && v.get_double() < 1.8e19) return uint64_t(v.get_double());
  throw std::runtime_error(what + " must be a non-negative integer");
}

inline double number(const boost::json::object& o, const char* name, const std::string& what) {
  return number_value(field(o, name, what), what + ": field '" + name + "'");
}

inline int64_t integer(const boost::json::object& o, const char* name, const std::string& what) {
  return integer_value(field(o, name, what), what + ": field '" + name + "'");
}

inline uint64_t unsigned_integer(const boost::json::object& o, const char* name, const std::string& what) {
  return unsigned_value(field(o, name, what), what + ": field '" + name + "'");
}

inline bool boolean(const boost::json::object& o, const char* name, const std::string& what) {
  const auto& v = field(o, name, what);
  if (!v.is_bool()) throw std::runtime_error(what + ": field '" + name + "' must be true or false");
  return v.get_bool();
}

inline std::string string(const boost::json::object& o, const char* name, const std::string& what) {
  const auto& v = field(o, name, what);
  if (!v.is_string()) throw std::runtime_error(what + ": field '" + name + "' must be a string");
  return std::string(v.get_string());
}

inline const boost::json::array& array(const boost::json::object& o, const char* name, const std::string& what) {
  const auto& v = field(o, name, what);
  if (!v.is_array()) throw std::runtime_error(what + ": field '" + name + "' must be an array");
  return v.get_array();
}

// Optional fields: the default when absent.
inline std::string string_or(const boost::json::object& o, const char* name, std::string fallback) {
  const boost::json::value* v = o.if_contains(name);
  return v && v->is_string() ? std::string(v->get_string()) : fallback;
}

}  // namespace tierlm::calibrate::json
