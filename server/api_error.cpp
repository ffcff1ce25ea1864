#include "server/api_error.h"

#include <boost/json.hpp>

namespace tierlm::server {

std::string error_body(const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  boost::json::object error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = param.empty() ? boost::json::value(nullptr) : boost::json::value(param);
  error["code"] = code.empty() ? boost::json::value(nullptr) : boost::json::value(code);
  boost::json::object body;
  body["error"] = std::move(error);
  return boost::json::serialize(body);
}

std::string ApiError::body() const { return error_body(what(), type_, param_, code_); }

}  // namespace tierlm::server
