// server/http_request_reading.h — how the server reads one HTTP request with Beast: the parser's limits, and the
// header facts of a parsed request that server/request_policy.h decides on. Shared by http_server.cpp and the HTTP
// fuzz harness (tests/fuzz/http_request.cpp), so the harness fuzzes the server's own parser configuration.
// Beast's headers are heavy: include this only where Beast is already needed. Never: performs I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <boost/beast/http.hpp>

#include "server/request_policy.h"

namespace tierlm::server {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

inline constexpr std::uint32_t kMaxRequestHeaderBytes = 16 * 1024;  // larger header sections get 431

// A bigger body is refused with 413 once its header fields are read; bigger headers with 431.
inline void limit_request_parser(HttpRequestParser& parser, std::uint64_t max_body_bytes) {
  parser.body_limit(max_body_bytes);
  parser.header_limit(kMaxRequestHeaderBytes);
}

template <class Key>
std::optional<std::string_view> header_value(const HttpRequest& request, Key key) {
  const auto it = request.find(key);
  if (it == request.end()) return std::nullopt;
  return std::string_view(it->value().data(), it->value().size());
}

// What check_request needs; the views point into `request`.
inline RequestFacts request_facts(const HttpRequest& request, std::string_view local_address) {
  namespace http = boost::beast::http;
  RequestFacts facts;
  facts.method = std::string_view(request.method_string().data(), request.method_string().size());
  facts.target = std::string_view(request.target().data(), request.target().size());
  facts.version = request.version();
  facts.host = header_value(request, http::field::host);
  facts.origin = header_value(request, http::field::origin);
  facts.content_type = header_value(request, http::field::content_type);
  facts.authorization = header_value(request, http::field::authorization);
  facts.x_api_key = header_value(request, "x-api-key");
  facts.preflight_method = header_value(request, http::field::access_control_request_method);
  facts.local_address = local_address;
  return facts;
}

}  // namespace tierlm::server
