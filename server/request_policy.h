// server/request_policy.h — who may talk to the server and how, decided from a request's header values alone:
// the Host allow-list (DNS rebinding), the Origin check and JSON content type for POSTs (cross-site browser requests),
// CORS preflight, bearer-key auth (constant time), the route table with its methods, and the x-request-id a
// response carries. Plain string_views in, a Verdict out: no Beast, no sockets, no logging, no allocation beyond the
// verdict's strings, so it can be unit-tested and fuzzed on its own. http_server.cpp applies the verdict.
// Never: throws on request input (only make_policy throws, on bad command-line values).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tierlm::server {

struct RequestPolicy {
  bool any_host = false;                 // --allowed-hosts '*': no Host check
  std::vector<std::string> extra_hosts;  // --allowed-hosts names, lowercase, no port
  std::string bound_address;             // the listening address (--host)
  std::vector<std::string> cors_origins; // normalized "scheme://host[:port]"
  std::string api_key;                   // empty: no auth
};

// Builds the policy from the command-line values; each list entry may hold several comma-separated items.
// Throws std::invalid_argument for an entry that is not a host name / an origin ("*" is refused as a CORS origin:
// name the origins).
RequestPolicy make_policy(const std::vector<std::string>& allowed_hosts, const std::vector<std::string>& cors_origins,
                          std::string bound_address, std::string api_key);

// One request as far as the policy cares. An absent header is nullopt (an empty one is "").
struct RequestFacts {
  std::string_view method;               // e.g. "GET", as sent
  std::string_view target;               // path and query
  unsigned version = 11;                 // 10 or 11
  std::optional<std::string_view> host;
  std::optional<std::string_view> origin;
  std::optional<std::string_view> content_type;
  std::optional<std::string_view> authorization;
  std::optional<std::string_view> x_api_key;         // Anthropic clients' key header, taken alongside Bearer
  std::optional<std::string_view> preflight_method;  // Access-Control-Request-Method
  std::string_view local_address;        // the address this connection reached (e.g. "192.168.1.5")
};

enum class Action {
  serve,      // run the route (head: headers only)
  preflight,  // answer 204 with the CORS preflight headers (or the Allow header for a plain OPTIONS)
  refuse,     // answer status with an OpenAI-style error
};

struct Verdict {
  Action action = Action::refuse;
  std::string route = "other";  // the matched route, "other" when none (the metrics label)
  bool head = false;            // HEAD on a GET route
  int status = 0;               // refuse: the HTTP status
  std::string reason;           // refuse: the metrics label (tierlm_http_rejected_total{reason})
  std::string code;             // refuse: the error body's code
  std::string message;          // refuse: the error body's message
  std::string allow;            // the Allow header (405 and OPTIONS)
  std::string cors_origin;      // non-empty: send Access-Control-Allow-Origin with this origin
};

Verdict check_request(const RequestPolicy& policy, const RequestFacts& facts);
// The metrics label of a target's route ("other" when it is none), for requests refused before a verdict (413).
std::string route_label(std::string_view target);
// What the server should warn about at start: bound beyond loopback with no API key, the Host check turned off.
std::vector<std::string> startup_warnings(const RequestPolicy& policy);

// The building blocks, public for tests.

// The host part of a Host header value ("name[:port]", "1.2.3.4[:port]", "[v6][:port]"), lowercase, without
// brackets or a trailing dot; nullopt when malformed (bad port, stray characters, empty).
std::optional<std::string> host_name(std::string_view host_header);
// localhost (and *.localhost), any 127.0.0.0/8 address, ::1 and ::ffff:127.x.
bool is_loopback(std::string_view host);
bool host_allowed(const RequestPolicy& policy, std::string_view host_header, std::string_view local_address);
// "scheme://host[:port]" lowercase with the scheme's default port dropped; nullopt when not an http(s) origin.
std::optional<std::string> normalize_origin(std::string_view origin);
// Same origin as the server the request reached (the Origin's host[:port] is the Host header's, default ports equal).
bool same_origin(std::string_view origin, std::string_view host_header);
// application/json, with any parameters (charset), case-insensitive.
bool is_json_content_type(std::string_view content_type);
// The credentials of "Bearer TOKEN" (scheme case-insensitive); nullopt for any other scheme.
std::optional<std::string_view> bearer_token(std::string_view authorization);
// Constant time in the length of `provided` (which the client knows) whatever the key: neither the key's bytes nor
// its length show in the timing.
bool key_matches(std::string_view provided, std::string_view key);
// The decoded value of ?key=... in a request target ("" when absent).
std::string query_param(std::string_view target, std::string_view key);
// %XX escapes decoded (and '+' as a space in a query); malformed escapes kept as they are.
std::string percent_decode(std::string_view text, bool plus_is_space = false);
// The client's x-request-id when sane (1..128 printable ASCII characters), else a fresh random one.
std::string request_id(std::optional<std::string_view> client_value);
// The target with its query replaced by "?…", for log lines (a query may carry api_key).
std::string loggable_target(std::string_view target);

}  // namespace tierlm::server
