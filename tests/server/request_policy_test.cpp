// server/request_policy.h on its own: Host allow-list, Origin/content type for POSTs, CORS preflight, bearer auth
// (scheme case, constant-time compare), routes and methods, request ids. Every expectation is an exact value.
#include "server/request_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "server/log_throttle.h"

namespace tierlm::server {
namespace {

RequestFacts get(std::string_view target, std::string_view host = "127.0.0.1:5413") {
  RequestFacts f;
  f.method = "GET";
  f.target = target;
  f.host = host;
  f.local_address = "127.0.0.1";
  return f;
}

RequestFacts post_json(std::string_view target, std::string_view host = "127.0.0.1:5413") {
  RequestFacts f = get(target, host);
  f.method = "POST";
  f.content_type = "application/json";
  return f;
}

RequestPolicy loopback_policy(std::string key = {}) { return make_policy({}, {}, "127.0.0.1", std::move(key)); }

TEST(RequestPolicy, HostNameParsing) {
  EXPECT_EQ(host_name("LocalHost:5413").value(), "localhost");
  EXPECT_EQ(host_name("127.0.0.1").value(), "127.0.0.1");
  EXPECT_EQ(host_name("[::1]:80").value(), "::1");
  EXPECT_EQ(host_name("[::1]").value(), "::1");
  EXPECT_EQ(host_name("example.com.").value(), "example.com");
  for (const char* bad : {"", ":80", "a:b", "a:", "a:123456", "a:70000", "[::1", "[]:1", "a b", "a/b", "::1", "[x]",
                          "a@b", "a:80:80", "[::1]x", "[::1]:"})
    EXPECT_FALSE(host_name(bad).has_value()) << bad;
}

TEST(RequestPolicy, LoopbackNamesAndAddresses) {
  for (const char* yes : {"localhost", "app.localhost", "127.0.0.1", "127.8.9.10", "::1", "0:0:0:0:0:0:0:1",
                          "::ffff:127.0.0.1"})
    EXPECT_TRUE(is_loopback(yes)) << yes;
  for (const char* no : {"localhost.example.com", "evil.com", "128.0.0.1", "10.0.0.1", "::2", "0.0.0.0", "::",
                         "xlocalhost", "::ffff:10.0.0.1"})
    EXPECT_FALSE(is_loopback(no)) << no;
}

TEST(RequestPolicy, HostAllowList) {
  const RequestPolicy p = loopback_policy();
  for (const char* ok : {"localhost", "localhost:5413", "127.0.0.1", "127.0.0.1:1", "127.3.4.5:99", "[::1]",
                         "[::1]:5413", "LOCALHOST:5413"})
    EXPECT_TRUE(host_allowed(p, ok, "127.0.0.1")) << ok;
  for (const char* bad : {"evil.com", "evil.com:5413", "localhost.evil.com", "127.0.0.1.evil.com", "", "10.0.0.1",
                          "attacker.example:5413"})
    EXPECT_FALSE(host_allowed(p, bad, "127.0.0.1")) << bad;

  // --allowed-hosts adds names (comma lists, any case, a port given is ignored); '*' turns the check off.
  const RequestPolicy extra = make_policy({"Example.COM, api.example.com:8080", "other.test"}, {}, "127.0.0.1", "");
  EXPECT_TRUE(host_allowed(extra, "example.com:5413", "127.0.0.1"));
  EXPECT_TRUE(host_allowed(extra, "API.example.com", "127.0.0.1"));
  EXPECT_TRUE(host_allowed(extra, "other.test", "127.0.0.1"));
  EXPECT_FALSE(host_allowed(extra, "sub.example.com", "127.0.0.1"));
  const RequestPolicy any = make_policy({"*"}, {}, "127.0.0.1", "");
  EXPECT_TRUE(any.any_host);
  EXPECT_TRUE(host_allowed(any, "whatever.example", "127.0.0.1"));

  // The bound address, and (bound to 0.0.0.0) the address this connection reached; never another IP.
  const RequestPolicy lan = make_policy({}, {}, "192.168.1.5", "");
  EXPECT_TRUE(host_allowed(lan, "192.168.1.5:5413", "192.168.1.5"));
  const RequestPolicy wildcard = make_policy({}, {}, "0.0.0.0", "");
  EXPECT_TRUE(host_allowed(wildcard, "10.1.2.3:5413", "10.1.2.3"));
  EXPECT_TRUE(host_allowed(wildcard, "10.1.2.3", "::ffff:10.1.2.3"));
  EXPECT_FALSE(host_allowed(wildcard, "10.9.9.9", "10.1.2.3"));
  EXPECT_FALSE(host_allowed(wildcard, "nas.local", "10.1.2.3"));

  EXPECT_THROW(make_policy({"bad host"}, {}, "127.0.0.1", ""), std::invalid_argument);
}

TEST(RequestPolicy, WrongHostIs403BeforeAnythingElse) {
  const RequestPolicy p = loopback_policy("key");
  for (auto f : {get("/health", "evil.com"), get("/nothing", "evil.com:5413"), post_json("/v1/completions", "evil.com")}) {
    const Verdict v = check_request(p, f);
    EXPECT_EQ(v.action, Action::refuse);
    EXPECT_EQ(v.status, 403);
    EXPECT_EQ(v.code, "host_not_allowed");
    EXPECT_EQ(v.reason, "host_not_allowed");
  }
  RequestFacts no_host = get("/v1/models");
  no_host.host.reset();
  EXPECT_EQ(check_request(loopback_policy(), no_host).status, 400);  // HTTP/1.1 needs one
  no_host.version = 10;
  EXPECT_EQ(check_request(loopback_policy(), no_host).action, Action::serve);  // HTTP/1.0 may omit it
}

TEST(RequestPolicy, OriginsNormalize) {
  EXPECT_EQ(normalize_origin("HTTP://Example.com:80").value(), "http://example.com");
  EXPECT_EQ(normalize_origin("https://example.com:443").value(), "https://example.com");
  EXPECT_EQ(normalize_origin("https://example.com:8443/").value(), "https://example.com:8443");
  EXPECT_EQ(normalize_origin("http://[::1]:5413").value(), "http://[::1]:5413");
  for (const char* bad : {"null", "", "file://", "example.com", "ftp://x", "http://", "http://a b", "http://x/path"})
    EXPECT_FALSE(normalize_origin(bad).has_value()) << bad;
  EXPECT_TRUE(same_origin("http://127.0.0.1:5413", "127.0.0.1:5413"));
  EXPECT_TRUE(same_origin("http://localhost", "localhost:80"));
  EXPECT_FALSE(same_origin("http://localhost:3000", "localhost:5413"));
  EXPECT_FALSE(same_origin("http://evil.com:5413", "127.0.0.1:5413"));
  EXPECT_THROW(make_policy({}, {"*"}, "127.0.0.1", ""), std::invalid_argument);
  EXPECT_THROW(make_policy({}, {"example.com"}, "127.0.0.1", ""), std::invalid_argument);
}

TEST(RequestPolicy, BrowserPostsNeedAllowedOriginAndJson) {
  const RequestPolicy p = loopback_policy();
  // A page of another site posting text/plain (a CORS "simple" request, no preflight): refused.
  RequestFacts simple = post_json("/v1/completions");
  simple.origin = "https://evil.example";
  simple.content_type = "text/plain";
  Verdict v = check_request(p, simple);
  EXPECT_EQ(v.status, 403);
  EXPECT_EQ(v.code, "origin_not_allowed");
  // Same site but text/plain: 415.
  simple.origin.reset();
  v = check_request(p, simple);
  EXPECT_EQ(v.status, 415);
  EXPECT_EQ(v.reason, "unsupported_media_type");
  for (const char* type : {"application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx",
                           "text/json", ""}) {
    simple.content_type = type;
    EXPECT_EQ(check_request(p, simple).status, 415) << type;
  }
  simple.content_type.reset();
  EXPECT_EQ(check_request(p, simple).status, 415);
  for (const char* type : {"application/json", "Application/JSON; charset=utf-8", " application/json ;charset=UTF-8"}) {
    simple.content_type = type;
    EXPECT_EQ(check_request(p, simple).action, Action::serve) << type;
  }
  // JSON from another origin: still 403; from the server's own origin: served.
  RequestFacts json = post_json("/v1/chat/completions");
  json.origin = "http://localhost:3000";
  EXPECT_EQ(check_request(p, json).status, 403);
  json.origin = "http://127.0.0.1:5413";
  EXPECT_EQ(check_request(p, json).action, Action::serve);
  EXPECT_TRUE(check_request(p, json).cors_origin.empty());
  // A GET with a foreign Origin is served (no state changes, and without CORS headers the page cannot read it).
  RequestFacts g = get("/v1/models");
  g.origin = "https://evil.example";
  v = check_request(p, g);
  EXPECT_EQ(v.action, Action::serve);
  EXPECT_TRUE(v.cors_origin.empty());
}

TEST(RequestPolicy, CorsOriginsAndPreflight) {
  const RequestPolicy off = loopback_policy();
  RequestFacts pre = get("/v1/chat/completions");
  pre.method = "OPTIONS";
  pre.origin = "https://app.example.com";
  pre.preflight_method = "POST";
  EXPECT_EQ(check_request(off, pre).status, 403);  // CORS off by default

  const RequestPolicy on = make_policy({}, {"https://app.example.com,http://localhost:3000", "https://b.test"},
                                       "127.0.0.1", "key");
  Verdict v = check_request(on, pre);  // no key needed: preflights carry no credentials
  EXPECT_EQ(v.action, Action::preflight);
  EXPECT_EQ(v.cors_origin, "https://app.example.com");
  EXPECT_EQ(v.allow, "POST, OPTIONS");
  pre.origin = "https://other.example.com";
  EXPECT_EQ(check_request(on, pre).status, 403);
  pre.target = "/v1/nothing";
  EXPECT_EQ(check_request(on, pre).status, 404);

  RequestFacts post = post_json("/v1/completions");
  post.origin = "http://localhost:3000";
  post.authorization = "Bearer key";
  v = check_request(on, post);
  EXPECT_EQ(v.action, Action::serve);
  EXPECT_EQ(v.cors_origin, "http://localhost:3000");
  post.origin = "http://localhost:3001";
  EXPECT_EQ(check_request(on, post).status, 403);

  RequestFacts plain = get("/health");
  plain.method = "OPTIONS";
  v = check_request(off, plain);
  EXPECT_EQ(v.action, Action::preflight);
  EXPECT_EQ(v.allow, "GET, HEAD, OPTIONS");
}

TEST(RequestPolicy, BearerSchemeIsCaseInsensitive) {
  EXPECT_EQ(bearer_token("Bearer abc").value(), "abc");
  EXPECT_EQ(bearer_token("bearer abc").value(), "abc");
  EXPECT_EQ(bearer_token("BEARER   abc  ").value(), "abc");
  EXPECT_EQ(bearer_token("bEaReR\tabc").value(), "abc");
  for (const char* bad : {"Basic abc", "Bearer", "Bearer ", "Bearerabc", "Token abc", "", "abc"})
    EXPECT_FALSE(bearer_token(bad).has_value()) << bad;
}

TEST(RequestPolicy, KeyComparison) {
  EXPECT_TRUE(key_matches("sekret-123", "sekret-123"));
  EXPECT_FALSE(key_matches("sekret-124", "sekret-123"));
  EXPECT_FALSE(key_matches("sekret-12", "sekret-123"));
  EXPECT_FALSE(key_matches("sekret-1234", "sekret-123"));
  EXPECT_FALSE(key_matches("sekret-123sekret-123", "sekret-123"));  // the key repeated is not the key
  EXPECT_FALSE(key_matches("", "sekret-123"));
  EXPECT_FALSE(key_matches("", ""));
  EXPECT_FALSE(key_matches("x", ""));
}

TEST(RequestPolicy, AuthCoversEveryRouteButLivenessAndThePage) {
  const RequestPolicy p = loopback_policy("sekret");
  for (const char* target : {"/health", "/metrics", "/v1/models", "/v1/telemetry", "/wisdom", "/nothing"}) {
    const Verdict v = check_request(p, get(target));
    EXPECT_EQ(v.status, 401) << target;
    EXPECT_EQ(v.code, "invalid_api_key") << target;
  }
  EXPECT_EQ(check_request(p, post_json("/v1/completions")).status, 401);
  EXPECT_EQ(check_request(p, get("/health/live")).action, Action::serve);
  EXPECT_EQ(check_request(p, get("/")).action, Action::serve);
  for (const char* header : {"Bearer sekret", "bearer sekret", "BEARER sekret"}) {
    RequestFacts f = get("/health");
    f.authorization = header;
    EXPECT_EQ(check_request(p, f).action, Action::serve) << header;
  }
  RequestFacts wrong = get("/health");
  wrong.authorization = "Bearer sekreT";
  EXPECT_EQ(check_request(p, wrong).status, 401);
  // ?api_key= only where EventSource needs it.
  EXPECT_EQ(check_request(p, get("/v1/telemetry?api_key=sekret")).action, Action::serve);
  EXPECT_EQ(check_request(p, get("/v1/telemetry?limit=1&api_key=sek%72et")).action, Action::serve);
  EXPECT_EQ(check_request(p, get("/health?api_key=sekret")).status, 401);
}

TEST(RequestPolicy, RoutesAndMethods) {
  const RequestPolicy p = loopback_policy();
  EXPECT_EQ(check_request(p, get("/v1/nothing")).status, 404);
  EXPECT_EQ(check_request(p, get("/v1/nothing")).route, "other");
  Verdict v = check_request(p, get("/v1/completions"));
  EXPECT_EQ(v.status, 405);
  EXPECT_EQ(v.allow, "POST, OPTIONS");
  RequestFacts del = get("/health");
  del.method = "DELETE";
  v = check_request(p, del);
  EXPECT_EQ(v.status, 405);
  EXPECT_EQ(v.allow, "GET, HEAD, OPTIONS");
  RequestFacts head = get("/metrics?x=1");
  head.method = "HEAD";
  v = check_request(p, head);
  EXPECT_EQ(v.action, Action::serve);
  EXPECT_TRUE(v.head);
  EXPECT_EQ(v.route, "/metrics");
  RequestFacts lower = get("/health");
  lower.method = "get";  // methods are case-sensitive
  EXPECT_EQ(check_request(p, lower).status, 405);
  EXPECT_EQ(route_label("/v1/completions?x"), "/v1/completions");
  EXPECT_EQ(route_label("/x"), "other");
}

TEST(RequestPolicy, RequestIds) {
  EXPECT_EQ(request_id(std::string_view("abc-123")), "abc-123");
  EXPECT_EQ(request_id(std::string_view(std::string(128, 'x'))), std::string(128, 'x'));
  std::set<std::string> generated;
  for (auto bad : {std::optional<std::string_view>{}, std::optional<std::string_view>{""},
                   std::optional<std::string_view>{"line\nbreak"}, std::optional<std::string_view>{"tab\there"},
                   std::optional<std::string_view>{"\x7f"}, std::optional<std::string_view>{"caf\xc3\xa9"}}) {
    const std::string id = request_id(bad);
    EXPECT_EQ(id.size(), 32u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    generated.insert(id);
  }
  const std::string long_one(129, 'y');
  EXPECT_EQ(request_id(std::string_view(long_one)).size(), 32u);
  EXPECT_EQ(generated.size(), 6u);
  EXPECT_EQ(loggable_target("/v1/telemetry?api_key=secret"), "/v1/telemetry?...");
  EXPECT_EQ(loggable_target("/health"), "/health");
}

TEST(RequestPolicy, StartupWarnings) {
  EXPECT_TRUE(startup_warnings(make_policy({}, {}, "127.0.0.1", "")).empty());
  EXPECT_TRUE(startup_warnings(make_policy({}, {}, "::1", "")).empty());
  EXPECT_TRUE(startup_warnings(make_policy({}, {}, "0.0.0.0", "key")).empty());
  for (const char* exposed : {"0.0.0.0", "::", "192.168.1.5", "[::]"}) {
    const auto w = startup_warnings(make_policy({}, {}, exposed, ""));
    ASSERT_EQ(w.size(), 1u) << exposed;
    EXPECT_NE(w[0].find("no API key"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("--api-key"), std::string::npos) << w[0];
  }
  const auto any = startup_warnings(make_policy({"*"}, {}, "127.0.0.1", "key"));
  ASSERT_EQ(any.size(), 1u);
  EXPECT_NE(any[0].find("DNS rebinding"), std::string::npos);
}

TEST(LogThrottle, OneLinePerIntervalWithTheCountHeldBack) {
  LogThrottle t(std::chrono::seconds(5));
  const auto t0 = LogThrottle::Clock::now();
  EXPECT_EQ(t.allow(t0).value(), 0u);
  for (int i = 1; i <= 1000; ++i) EXPECT_FALSE(t.allow(t0 + std::chrono::milliseconds(i)).has_value());
  EXPECT_EQ(t.allow(t0 + std::chrono::seconds(5)).value(), 1000u);
  EXPECT_FALSE(t.allow(t0 + std::chrono::seconds(6)).has_value());
  EXPECT_EQ(t.allow(t0 + std::chrono::seconds(11)).value(), 1u);
}

}  // namespace
}  // namespace tierlm::server
