#include "server/request_policy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <random>
#include <stdexcept>

namespace tierlm::server {

namespace {

struct Route {
  std::string_view path;
  bool post;        // POST route (else GET, with HEAD)
  bool open;        // served without the API key
  bool query_key;   // also takes ?api_key= (EventSource cannot set headers)
};

// "/" is the dashboard's static page (no data of its own: every route it reads needs the key); "/health/live" is the
// bare liveness probe.
constexpr std::array<Route, 13> kRoutes = {{
    {"/", false, true, false},
    {"/health", false, false, false},
    {"/health/live", false, true, false},
    {"/metrics", false, false, false},
    {"/v1/models", false, false, false},
    {"/v1/telemetry", false, false, true},
    {"/wisdom", false, false, false},
    {"/v1/chat/completions", true, false, false},
    {"/v1/completions", true, false, false},
    {"/v1/models/{id}", false, false, false},
    {"/v1/messages", true, false, false},
    {"/v1/messages/count_tokens", true, false, false},
    {"/v1/responses", true, false, false},
}};

const Route* find_route(std::string_view path) {
  for (const auto& r : kRoutes)
    if (r.path == path) return &r;
  // GET /v1/models/{id}: one path segment after the prefix.
  constexpr std::string_view kModel = "/v1/models/";
  if (path.starts_with(kModel) && path.size() > kModel.size() && path.substr(kModel.size()).find('/') == std::string_view::npos)
    return &kRoutes[9];
  return nullptr;
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// "name[:port]" / "[v6][:port]": the name (lowercase, no brackets, no trailing dot) and the port when given.
struct Authority {
  std::string name;
  std::optional<uint32_t> port;
};

std::optional<Authority> parse_authority(std::string_view s) {
  if (s.empty() || s.size() > 300) return std::nullopt;
  Authority a;
  std::string_view rest;
  if (s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos || close == 1) return std::nullopt;
    const std::string_view inside = s.substr(1, close - 1);
    for (char c : inside)
      if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')) return std::nullopt;
    a.name.assign(inside);
    rest = s.substr(close + 1);
  } else {
    const size_t colon = s.find(':');
    const std::string_view name = s.substr(0, colon);
    if (name.empty()) return std::nullopt;
    for (char c : name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_')) return std::nullopt;
    a.name.assign(name);
    rest = colon == std::string_view::npos ? std::string_view{} : s.substr(colon);
  }
  if (!rest.empty()) {
    if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6) return std::nullopt;
    uint32_t port = 0;
    for (char c : rest.substr(1)) {
      if (c < '0' || c > '9') return std::nullopt;
      port = port * 10 + uint32_t(c - '0');
    }
    if (port > 65535) return std::nullopt;
    a.port = port;
  }
  for (auto& c : a.name) c = lower(c);
  if (a.name.size() > 1 && a.name.back() == '.') a.name.pop_back();
  if (a.name.empty() || a.name == ".") return std::nullopt;
  return a;
}

// An IP literal as 16 bytes (IPv4 as IPv4-mapped IPv6), so "::ffff:10.0.0.1" and "10.0.0.1" compare equal.
std::optional<std::array<unsigned char, 16>> ip_bytes(std::string_view text) {
  if (text.size() >= 64) return std::nullopt;
  char buf[64];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = 0;
  std::array<unsigned char, 16> out{};
  unsigned char v4[4];
  if (inet_pton(AF_INET, buf, v4) == 1) {
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, v4, 4);
    return out;
  }
  if (inet_pton(AF_INET6, buf, out.data()) == 1) return out;
  return std::nullopt;
}

bool same_ip(std::string_view a, std::string_view b) {
  auto strip = [](std::string_view s) {
    if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
    return s;
  };
  const auto x = ip_bytes(strip(a)), y = ip_bytes(strip(b));
  return x && y && *x == *y;
}

bool is_v4_mapped(const std::array<unsigned char, 16>& ip) {
  for (int i = 0; i < 10; ++i)
    if (ip[size_t(i)]) return false;
  return ip[10] == 0xff && ip[11] == 0xff;
}

Verdict refuse(Verdict v, int status, std::string reason, std::string code, std::string message) {
  v.action = Action::refuse;
  v.status = status;
  v.reason = std::move(reason);
  v.code = std::move(code);
  v.message = std::move(message);
  return v;
}

std::vector<std::string> split_list(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const auto& value : values) {
    std::string_view rest = value;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view item = trim(rest.substr(0, comma));
      if (!item.empty()) out.emplace_back(item);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  return out;
}

}  // namespace

RequestPolicy make_policy(const std::vector<std::string>& allowed_hosts, const std::vector<std::string>& cors_origins,
                          std::string bound_address, std::string api_key) {
  RequestPolicy p;
  for (const auto& h : split_list(allowed_hosts)) {
    if (h == "*") {
      p.any_host = true;
      continue;
    }
    const auto name = host_name(h);
    if (!name) throw std::invalid_argument("--allowed-hosts: '" + h + "' is not a host name");
    p.extra_hosts.push_back(*name);
  }
  for (const auto& o : split_list(cors_origins)) {
    if (o == "*")
      throw std::invalid_argument("--cors-origin: '*' is not accepted; name each origin (e.g. https://app.example.com)");
    const auto origin = normalize_origin(o);
    if (!origin) throw std::invalid_argument("--cors-origin: '" + o + "' is not an origin (http[s]://host[:port])");
    p.cors_origins.push_back(*origin);
  }
  p.bound_address = std::move(bound_address);
  p.api_key = std::move(api_key);
  return p;
}

std::optional<std::string> host_name(std::string_view host_header) {
  auto a = parse_authority(host_header);
  if (!a) return std::nullopt;
  return std::move(a->name);
}

bool is_loopback(std::string_view host) {
  if (host == "localhost" || (host.size() > 10 && host.ends_with(".localhost"))) return true;
  const auto ip = ip_bytes(host);
  if (!ip) return false;
  if (is_v4_mapped(*ip)) return (*ip)[12] == 127;
  for (int i = 0; i < 15; ++i)
    if ((*ip)[size_t(i)]) return false;
  return (*ip)[15] == 1;  // ::1
}

bool host_allowed(const RequestPolicy& policy, std::string_view host_header, std::string_view local_address) {
  if (policy.any_host) return true;
  const auto name = host_name(host_header);
  if (!name) return false;
  if (is_loopback(*name)) return true;
  if (std::find(policy.extra_hosts.begin(), policy.extra_hosts.end(), *name) != policy.extra_hosts.end()) return true;
  // An IP literal cannot be rebound by DNS: the address the server is bound to, or the one this connection reached
  // (when bound to 0.0.0.0 / ::), is what a client typing that address sends.
  return same_ip(*name, policy.bound_address) || same_ip(*name, local_address);
}

std::optional<std::string> normalize_origin(std::string_view origin) {
  std::string scheme;
  if (origin.size() > 7 && iequals(origin.substr(0, 7), "http://")) {
    scheme = "http";
    origin.remove_prefix(7);
  } else if (origin.size() > 8 && iequals(origin.substr(0, 8), "https://")) {
    scheme = "https";
    origin.remove_prefix(8);
  } else {
    return std::nullopt;
  }
  if (!origin.empty() && origin.back() == '/') origin.remove_suffix(1);  // a configured "https://x/" means the origin
  const auto a = parse_authority(origin);
  if (!a) return std::nullopt;
  const bool bracket = a->name.find(':') != std::string::npos;
  std::string out = scheme;
  out += "://";
  if (bracket) out += '[';
  out += a->name;
  if (bracket) out += ']';
  const uint32_t default_port = scheme == "http" ? 80 : 443;
  if (a->port && *a->port != default_port) {
    out += ':';
    out += std::to_string(*a->port);
  }
  return out;
}

bool same_origin(std::string_view origin, std::string_view host_header) {
  const auto o = normalize_origin(origin);
  const auto h = parse_authority(host_header);
  if (!o || !h) return false;
  const bool https = o->starts_with("https://");
  const auto a = parse_authority(std::string_view(*o).substr(https ? 8 : 7));
  if (!a) return false;
  const uint32_t default_port = https ? 443 : 80;
  return a->name == h->name && a->port.value_or(default_port) == h->port.value_or(default_port);
}

bool is_json_content_type(std::string_view content_type) {
  return iequals(trim(content_type.substr(0, content_type.find(';'))), "application/json");
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  authorization = trim(authorization);
  size_t i = 0;
  while (i < authorization.size() && !is_space(authorization[i])) ++i;
  if (!iequals(authorization.substr(0, i), "bearer") || i == authorization.size()) return std::nullopt;
  const std::string_view token = trim(authorization.substr(i));
  if (token.empty()) return std::nullopt;
  return token;
}

bool key_matches(std::string_view provided, std::string_view key) {
  if (key.empty()) return false;
  // Every byte of `provided` is compared with the key repeated to its length, and the length difference is folded
  // in without a branch: the work depends only on provided.size(). volatile keeps the loop from ending early.
  volatile unsigned char diff = static_cast<unsigned char>(provided.size() != key.size());
  for (size_t i = 0; i < provided.size(); ++i)
    diff = diff | static_cast<unsigned char>(provided[i] ^ key[i % key.size()]);
  return diff == 0;
}

std::string percent_decode(std::string_view v, bool plus_is_space) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '%' && i + 2 < v.size() && hex(v[i + 1]) >= 0 && hex(v[i + 2]) >= 0) {
      out += char(hex(v[i + 1]) * 16 + hex(v[i + 2]));
      i += 2;
    } else {
      out += plus_is_space && v[i] == '+' ? ' ' : v[i];
    }
  }
  return out;
}

std::string query_param(std::string_view target, std::string_view key) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const auto eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == key) return percent_decode(pair.substr(eq + 1), true);
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return {};
}

std::string request_id(std::optional<std::string_view> client_value) {
  if (client_value && !client_value->empty() && client_value->size() <= 128 &&
      std::all_of(client_value->begin(), client_value->end(), [](char c) { return c >= 0x20 && c <= 0x7e; }))
    return std::string(*client_value);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (size_t i = 0; i < id.size(); i += 16) {
    uint64_t bits = rng();
    for (size_t j = 0; j < 16; ++j, bits >>= 4) id[i + j] = kHex[bits & 15];
  }
  return id;
}

std::string loggable_target(std::string_view target) {
  const auto q = target.find('?');
  return q == std::string_view::npos ? std::string(target) : std::string(target.substr(0, q)) + "?...";
}

std::string route_label(std::string_view target) {
  const Route* route = find_route(target.substr(0, target.find('?')));
  return route ? std::string(route->path) : "other";
}

std::vector<std::string> startup_warnings(const RequestPolicy& policy) {
  std::vector<std::string> out;
  const std::string_view bound = policy.bound_address;
  const bool bracketed = bound.size() >= 2 && bound.front() == '[' && bound.back() == ']';
  if (policy.api_key.empty() && !is_loopback(bracketed ? bound.substr(1, bound.size() - 2) : bound))
    out.push_back("listening on " + policy.bound_address + " (beyond loopback) with no API key: anyone who can reach "
                  "this address can run completions and read /health and /metrics; set --api-key (or TIERLM_API_KEY)");
  if (policy.any_host)
    out.push_back("--allowed-hosts '*': any Host header is answered, so a web page can reach this server through "
                  "DNS rebinding");
  return out;
}

Verdict check_request(const RequestPolicy& policy, const RequestFacts& facts) {
  Verdict v;
  const std::string_view path = facts.target.substr(0, facts.target.find('?'));
  const Route* route = find_route(path);
  if (route) v.route = std::string(route->path);
  if (route) v.allow = route->post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";

  // Host first: a rebound name learns nothing, not even which routes exist.
  if (!facts.host) {
    if (facts.version >= 11)
      return refuse(std::move(v), 400, "missing_host", "missing_host", "HTTP/1.1 requests must carry a Host header.");
  } else if (!host_allowed(policy, *facts.host, facts.local_address)) {
    return refuse(std::move(v), 403, "host_not_allowed", "host_not_allowed",
                  "This Host header is not allowed (the server answers loopback names and its own address; "
                  "start it with --allowed-hosts to add names).");
  }
  const std::optional<std::string> origin =
      facts.origin ? normalize_origin(*facts.origin) : std::optional<std::string>{};
  const bool cors_allowed = origin && std::find(policy.cors_origins.begin(), policy.cors_origins.end(), *origin) !=
                                          policy.cors_origins.end();
  if (cors_allowed) v.cors_origin = *origin;

  // OPTIONS needs no key: a browser's preflight never carries credentials.
  if (facts.method == "OPTIONS") {
    if (!route)
      return refuse(std::move(v), 404, "not_found", "unknown_url", "Unknown route: OPTIONS " + std::string(path));
    if (facts.origin && facts.preflight_method && !cors_allowed)
      return refuse(std::move(v), 403, "origin_not_allowed", "origin_not_allowed",
                    "Cross-origin requests from this origin are not allowed (see --cors-origin).");
    v.action = Action::preflight;
    return v;
  }

  if (!policy.api_key.empty() && !(route && route->open)) {
    const auto token = facts.authorization ? bearer_token(*facts.authorization) : std::nullopt;
    bool ok = token && key_matches(*token, policy.api_key);
    // Anthropic's clients send the key as x-api-key.
    if (!ok && facts.x_api_key) ok = key_matches(*facts.x_api_key, policy.api_key);
    if (!ok && route && route->query_key) {
      const std::string q = query_param(facts.target, "api_key");
      ok = !q.empty() && key_matches(q, policy.api_key);
    }
    if (!ok)
      return refuse(std::move(v), 401, "unauthorized", "invalid_api_key",
                    facts.authorization || facts.x_api_key
                        ? "Incorrect API key provided."
                        : "You didn't provide an API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY').");
  }

  if (!route)
    return refuse(std::move(v), 404, "not_found", "unknown_url",
                  "Unknown route: " + std::string(facts.method) + " " + std::string(path));
  const bool method_ok = route->post ? facts.method == "POST" : facts.method == "GET" || facts.method == "HEAD";
  if (!method_ok)
    return refuse(std::move(v), 405, "method_not_allowed", "method_not_allowed",
                  "Method " + std::string(facts.method) + " is not allowed on " + std::string(path) + ".");
  if (route->post) {
    // A browser sends Origin on every POST: a page of another site (or a rebound name) may not drive the server.
    if (facts.origin && !cors_allowed && !(facts.host && same_origin(*facts.origin, *facts.host)))
      return refuse(std::move(v), 403, "origin_not_allowed", "origin_not_allowed",
                    "Cross-origin requests from this origin are not allowed (see --cors-origin).");
    // Only a JSON body runs a completion: text/plain, form and multipart posts are what a page can send without a
    // CORS preflight.
    if (!facts.content_type || !is_json_content_type(*facts.content_type))
      return refuse(std::move(v), 415, "unsupported_media_type", "unsupported_media_type",
                    "The request body must be JSON, sent with 'Content-Type: application/json'.");
  }
  v.head = facts.method == "HEAD";
  v.action = Action::serve;
  return v;
}

}  // namespace tierlm::server
