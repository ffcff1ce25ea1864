// server/api_error.h — the one error type route handlers throw; the HTTP layer turns it into an OpenAI-style body
// {"error":{"message","type","param","code"}} with its status. Never: carries internal details the client cannot act on.
#pragma once

#include <stdexcept>
#include <string>

namespace tierlm::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = {},
           std::string code = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }  // empty: null
  const std::string& code() const { return code_; }    // empty: null
  // The JSON body, serialized.
  std::string body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

// Builds the body for an error that is not an ApiError (e.g. a body-limit or parse failure in the HTTP layer).
std::string error_body(const std::string& message, const std::string& type, const std::string& param = {},
                       const std::string& code = {});

}  // namespace tierlm::server
