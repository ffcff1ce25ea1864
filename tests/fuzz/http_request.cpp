// Fuzzes raw HTTP/1.x bytes as a connection delivers them: Beast's request parser with the server's limits
// (server/http_request_reading.h), request after request while keep-alive holds (pipelining), then what the server
// derives from each: the request-policy verdict under a default and a strict policy, x-request-id, route label,
// loggable target and query parameters. On a parse error it does what the session does with the partial request.
// Nothing here may throw: Beast reports errors as codes and request_policy never throws on input.
#include <cstdint>
#include <string>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include "server/http_request_reading.h"
#include "server/http_server.h"
#include "tests/fuzz/fuzz_harness.h"

namespace {

using namespace tierlm::server;
namespace http = boost::beast::http;

const RequestPolicy& loopback_policy() {
  static const RequestPolicy p = make_policy({}, {}, "127.0.0.1", "");
  return p;
}
const RequestPolicy& strict_policy() {
  static const RequestPolicy p =
      make_policy({"proxy.example.com,10.0.0.7"}, {"https://app.example.com,http://localhost:3000"}, "0.0.0.0",
                  "sk-fuzz-key");
  return p;
}

void check_verdict(const Verdict& v) {
  TIERLM_FUZZ_CHECK(v.action != Action::refuse || (v.status >= 400 && v.status < 600 && !v.message.empty()));
}

void derive(const HttpRequest& request, bool complete) {
  const std::string_view target(request.target().data(), request.target().size());
  const std::string id = request_id(header_value(request, "x-request-id"));
  TIERLM_FUZZ_CHECK(!id.empty() && id.size() <= 128);
  (void)route_label(target);
  if (!complete) return;
  (void)loggable_target(target);
  (void)query_param(target, "api_key");
  (void)query_param(target, "limit");
  for (std::string_view local : {"127.0.0.1", "192.168.1.5", "::1"}) {
    check_verdict(check_request(loopback_policy(), request_facts(request, local)));
    check_verdict(check_request(strict_policy(), request_facts(request, local)));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tierlm::fuzz::silence_logs();
  (void)loopback_policy();
  (void)strict_policy();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  boost::beast::flat_buffer buffer;
  buffer.commit(boost::asio::buffer_copy(buffer.prepare(size), boost::asio::buffer(data, size)));
  const uint64_t max_body = HttpServerOptions{}.max_body_bytes;
  for (int requests = 0; requests < 16; ++requests) {
    HttpRequestParser parser;
    limit_request_parser(parser, max_body);
    parser.eager(true);  // as http::async_read sets it
    boost::beast::error_code ec;
    while (!parser.is_done()) {
      const size_t used = buffer.size() > 0 ? parser.put(buffer.data(), ec) : 0;
      buffer.consume(used);
      if (ec == http::error::need_more || (!ec && used == 0)) {
        ec = {};
        if (used > 0) continue;
        // No progress: the connection has no more bytes. As Beast's read does: end of stream before any byte,
        // else put_eof.
        if (!parser.got_some()) ec = http::error::end_of_stream;
        else parser.put_eof(ec);
        if (!ec && !parser.is_done()) ec = http::error::partial_message;
      }
      if (ec) break;
    }
    if (ec) {
      derive(parser.get(), false);
      return 0;
    }
    const HttpRequest& request = parser.get();
    TIERLM_FUZZ_CHECK(request.body().size() <= max_body);
    derive(request, true);
    if (!request.keep_alive() || buffer.size() == 0) break;
  }
  return 0;
}
