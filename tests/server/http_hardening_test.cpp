// `tierlm serve` hardening, end to end over raw loopback sockets with exact headers (issue 13): Host allow-list,
// Origin / content type, CORS, auth on every route but /health/live, HEAD and Allow, HTTP/1.0 without chunked
// encoding, x-request-id, Retry-After, the connection cap, accept back-off when out of file descriptors, request
// deadlines, queued clients that hang up, KV positions after cancellation, the resolved thread count, and every
// refusal counted in /metrics. The engine is held still with blocking observers where timing would otherwise race
// the model's speed.
#include <sys/resource.h>
#include <sys/time.h>

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>

#include <atomic>
#include <future>
#include <mutex>
#include <regex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "runtime/kernels/thread_pool.h"
#include "tests/server/test_client.h"

namespace tierlm::server::testing {
namespace {

namespace json = boost::json;

// Sends raw bytes on a fresh connection and reads until the server closes it.
HttpResponse raw(uint16_t port, const std::string& bytes, std::string* wire = nullptr) {
  const int fd = connect_loopback(port);
  send_all(fd, bytes);
  const std::string all = read_all(fd);
  ::close(fd);
  if (wire) *wire = all;
  return parse_response(all);
}

std::string post_text(const std::string& target, const std::string& body, const std::string& headers,
                      const std::string& version = "HTTP/1.1") {
  return "POST " + target + " " + version + "\r\n" + headers + "Content-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// A response header's value (names case-insensitive); nullopt when absent.
std::optional<std::string> header_of(const HttpResponse& r, const std::string& name) {
  std::string lower_name = name;
  for (auto& c : lower_name) c = char(std::tolower(static_cast<unsigned char>(c)));
  size_t pos = 0;
  while (pos < r.headers.size()) {
    size_t eol = r.headers.find("\r\n", pos);
    if (eol == std::string::npos) eol = r.headers.size();
    const std::string line = r.headers.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string key = line.substr(0, colon);
      for (auto& c : key) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (key == lower_name) {
        size_t start = colon + 1;
        while (start < line.size() && line[start] == ' ') ++start;
        return line.substr(start);
      }
    }
    pos = eol + 2;
  }
  return std::nullopt;
}

std::string error_code(const HttpResponse& r) {
  try {
    const auto v = r.json();
    return std::string(v.at("error").at("code").as_string());
  } catch (...) {
    return "(no error code in: " + r.body + ")";
  }
}

template <class F>
bool eventually(F pred, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// The value of one sample line of the Prometheus text ("name{labels}"), or -1 when absent.
double metric(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// Holds the engine thread in its first on_token until released (or destroyed): its sequence keeps the slot and no
// step runs meanwhile, so queue states are set up without racing the model. Released, it asks to stop.
class EngineGate {
 public:
  explicit EngineGate(TestServer& s) : observer_(std::make_shared<Observer>(release_.get_future().share())) {
    engine::SequenceParams p;
    p.prompt = s.tokenizer().encode("gate", true);
    p.max_tokens = 8;
    handle_ = s.scheduler().submit(std::move(p), observer_);
    observer_->entered.get_future().wait();
  }
  ~EngineGate() { release(); }
  void release() {
    if (!released_.exchange(true)) release_.set_value();
  }

 private:
  struct Observer : engine::SequenceObserver {
    std::shared_future<void> release;
    std::promise<void> entered;
    bool first = true;
    explicit Observer(std::shared_future<void> r) : release(std::move(r)) {}
    bool on_token(const engine::TokenOutput&) override {
      if (first) {
        first = false;
        entered.set_value();
        release.wait();
      }
      return false;
    }
    void on_finish(const engine::SequenceResult&) override {
      if (first) {
        first = false;
        entered.set_value();
      }
    }
  };
  std::promise<void> release_;
  std::atomic<bool> released_{false};
  std::shared_ptr<Observer> observer_;
  std::shared_ptr<engine::SequenceHandle> handle_;
};

// A sequence that makes every engine step last at least 5 ms (it sleeps in on_token) until stopped or cancelled.
class SlowSteps {
 public:
  explicit SlowSteps(TestServer& s) : observer_(std::make_shared<Observer>()) {
    engine::SequenceParams p;
    p.prompt = s.tokenizer().encode("slow", true);
    p.max_tokens = 900;  // no stop tokens: it runs until cancelled (or its 900 tokens)
    handle_ = s.scheduler().submit(std::move(p), observer_);
  }
  ~SlowSteps() { handle_->cancel(); }
  engine::SequenceHandle& handle() { return *handle_; }

 private:
  struct Observer : engine::SequenceObserver {
    bool on_token(const engine::TokenOutput&) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return true;
    }
    void on_finish(const engine::SequenceResult&) override {}
  };
  std::shared_ptr<Observer> observer_;
  std::shared_ptr<engine::SequenceHandle> handle_;
};

// Every log line while alive, besides the usual output (the default logger is swapped, then restored).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<Sink>()), previous_(spdlog::default_logger()) {
    std::vector<spdlog::sink_ptr> sinks = previous_->sinks();
    sinks.push_back(sink_);
    auto logger = std::make_shared<spdlog::logger>("capture", sinks.begin(), sinks.end());
    logger->set_level(previous_->level());
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  size_t count(const std::string& needle) {
    std::lock_guard lock(sink_->lines_mutex);
    size_t n = 0;
    for (const auto& l : sink_->lines) n += l.find(needle) != std::string::npos;
    return n + (needle == sink_->counted ? sink_->dropped : 0);
  }
  std::string all() {
    std::lock_guard lock(sink_->lines_mutex);
    std::string out;
    for (const auto& l : sink_->lines) out += l + "\n";
    return out;
  }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    std::mutex lines_mutex;
    std::vector<std::string> lines;
    std::string counted = "accept failed";
    size_t dropped = 0;  // lines with `counted` beyond the first 1000 (a spinning loop makes millions)
    void sink_it_(const spdlog::details::log_msg& msg) override {
      std::lock_guard lock(lines_mutex);
      std::string line(msg.payload.data(), msg.payload.size());
      if (lines.size() >= 1000) {
        dropped += line.find(counted) != std::string::npos;
        return;
      }
      lines.push_back(std::move(line));
    }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

const std::string kJson = "Host: 127.0.0.1\r\nContent-Type: application/json\r\n";
const std::string kSmall = R"({"prompt":"x","max_tokens":2})";

// --- 2. security defaults ---------------------------------------------------------------------------------------

TEST(HttpHardening, HostOtherThanLoopbackOrTheServerIs403) {
  TestServer s;
  const std::string port = std::to_string(s.port());
  for (const std::string& host : std::vector<std::string>{"evil.example", "evil.example:" + port, "localhost.evil.example", "10.1.2.3"}) {
    auto r = raw(s.port(), "GET /v1/models HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(r.status, 403) << host;
    EXPECT_EQ(error_code(r), "host_not_allowed") << host;
    EXPECT_TRUE(header_of(r, "x-request-id").has_value());
  }
  // A completion through a rebound name never runs.
  const auto generated = s.scheduler().stats().generated_tokens_total;
  EXPECT_EQ(raw(s.port(), post_text("/v1/completions", kSmall,
                                    "Host: attacker.example:" + port + "\r\nContent-Type: application/json\r\n"))
                .status,
            403);
  EXPECT_EQ(s.scheduler().stats().generated_tokens_total, generated);
  for (const std::string& host : std::vector<std::string>{"localhost", "localhost:" + port, "127.0.0.1:" + port, "127.9.9.9", "[::1]:" + port}) {
    auto r = raw(s.port(), "GET /v1/models HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(r.status, 200) << host;
  }
  // HTTP/1.1 without Host: 400; --allowed-hosts adds names.
  EXPECT_EQ(raw(s.port(), "GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n").status, 400);
  ServerOptions o;
  o.http.allowed_hosts = {"tierlm.internal,other.internal"};
  TestServer named(o);
  EXPECT_EQ(raw(named.port(), "GET /v1/models HTTP/1.1\r\nHost: tierlm.internal:80\r\nConnection: close\r\n\r\n").status,
            200);
  EXPECT_EQ(raw(named.port(), "GET /v1/models HTTP/1.1\r\nHost: evil.internal\r\nConnection: close\r\n\r\n").status,
            403);
}

TEST(HttpHardening, CrossOriginSimplePostNeverRunsACompletion) {
  TestServer s;
  const auto generated = s.scheduler().stats().generated_tokens_total;
  // What a page on another site can send without a preflight: text/plain with its Origin.
  auto r = raw(s.port(), post_text("/v1/completions", kSmall,
                                   "Host: 127.0.0.1\r\nOrigin: https://evil.example\r\nContent-Type: text/plain\r\n"));
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(error_code(r), "origin_not_allowed");
  EXPECT_FALSE(header_of(r, "access-control-allow-origin").has_value());
  // The same with JSON (the page would need a preflight, which CORS-off refuses): still 403.
  r = raw(s.port(), post_text("/v1/chat/completions", kSmall,
                              "Host: 127.0.0.1\r\nOrigin: http://localhost:3000\r\nContent-Type: application/json\r\n"));
  EXPECT_EQ(r.status, 403);
  // Without Origin, a body that is not declared JSON: 415.
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=z"}) {
    r = raw(s.port(), post_text("/v1/completions", kSmall, "Host: 127.0.0.1\r\nContent-Type: " + type + "\r\n"));
    EXPECT_EQ(r.status, 415) << type;
    EXPECT_EQ(error_code(r), "unsupported_media_type");
  }
  EXPECT_EQ(raw(s.port(), post_text("/v1/completions", kSmall, "Host: 127.0.0.1\r\n")).status, 415);
  EXPECT_EQ(s.scheduler().stats().generated_tokens_total, generated);
  // The server's own origin, JSON: served.
  r = raw(s.port(), post_text("/v1/completions", kSmall,
                              "Host: 127.0.0.1:" + std::to_string(s.port()) + "\r\nOrigin: http://127.0.0.1:" +
                                  std::to_string(s.port()) + "\r\nContent-Type: application/json; charset=utf-8\r\n"));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(HttpHardening, CorsOnlyForTheConfiguredOrigins) {
  ServerOptions o;
  o.http.cors_origins = {"https://app.example.com", "http://localhost:3000"};
  TestServer s(o);
  auto pre = raw(s.port(),
                 "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://app.example.com\r\n"
                 "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n"
                 "Connection: close\r\n\r\n");
  EXPECT_EQ(pre.status, 204);
  EXPECT_EQ(header_of(pre, "access-control-allow-origin").value_or(""), "https://app.example.com");
  EXPECT_NE(header_of(pre, "access-control-allow-methods").value_or("").find("POST"), std::string::npos);
  EXPECT_NE(header_of(pre, "access-control-allow-headers").value_or("").find("Authorization"), std::string::npos);
  auto denied = raw(s.port(),
                    "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n"
                    "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(denied.status, 403);
  EXPECT_FALSE(header_of(denied, "access-control-allow-origin").has_value());

  auto ok = raw(s.port(), post_text("/v1/completions", kSmall,
                                    "Host: 127.0.0.1\r\nOrigin: http://localhost:3000\r\nContent-Type: application/json\r\n"));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(header_of(ok, "access-control-allow-origin").value_or(""), "http://localhost:3000");
  EXPECT_EQ(header_of(ok, "vary").value_or(""), "Origin");
  auto other = raw(s.port(), post_text("/v1/completions", kSmall,
                                       "Host: 127.0.0.1\r\nOrigin: http://localhost:3001\r\nContent-Type: application/json\r\n"));
  EXPECT_EQ(other.status, 403);
  // Without --cors-origin no response carries the header, whatever the Origin.
  TestServer plain;
  auto r = raw(plain.port(), "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://app.example.com\r\n"
                             "Connection: close\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(header_of(r, "access-control-allow-origin").has_value());
}

TEST(HttpHardening, KeyGuardsEveryRouteButLivenessAndItsSchemeIsCaseInsensitive) {
  ServerOptions o;
  o.http.api_key = "sekret-123";
  TestServer s(o);
  for (const char* target : {"/health", "/metrics", "/v1/models", "/wisdom", "/v1/telemetry?limit=1", "/nowhere"}) {
    auto r = request(s.port(), "GET", target);
    EXPECT_EQ(r.status, 401) << target;
    EXPECT_EQ(header_of(r, "www-authenticate").value_or("").rfind("Bearer", 0), 0u) << r.headers;
  }
  auto live = request(s.port(), "GET", "/health/live");
  EXPECT_EQ(live.status, 200);
  EXPECT_EQ(live.body, R"({"status":"ok"})");
  for (const char* scheme : {"Bearer", "bearer", "BEARER", "bEaReR"}) {
    auto r = post(s.port(), "/v1/completions", kSmall, std::string("Authorization: ") + scheme + " sekret-123\r\n");
    EXPECT_EQ(r.status, 200) << scheme << " " << r.body;
  }
  for (const char* bad : {"Bearer sekret-12", "Bearer sekret-1234", "Basic sekret-123", "sekret-123"}) {
    auto r = request(s.port(), "GET", "/health", {}, std::string("Authorization: ") + bad + "\r\n");
    EXPECT_EQ(r.status, 401) << bad;
    EXPECT_TRUE(header_of(r, "www-authenticate").has_value());
  }
  EXPECT_EQ(request(s.port(), "GET", "/health", {}, "Authorization: bearer sekret-123\r\n").status, 200);
}

// --- 4. protocol --------------------------------------------------------------------------------------------------

TEST(HttpHardening, HeadOnGetRoutesAndAllowOnEvery405) {
  TestServer s;
  const auto get = request(s.port(), "GET", "/v1/models");
  std::string wire;
  auto head = raw(s.port(), "HEAD /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", &wire);
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(header_of(head, "content-length").value_or(""), std::to_string(get.body.size()));
  EXPECT_EQ(head.body, "");  // headers only
  for (const char* target : {"/health", "/health/live", "/metrics", "/", "/v1/telemetry"}) {
    auto r = raw(s.port(), std::string("HEAD ") + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(r.status, 200) << target;
    EXPECT_EQ(r.body, "") << target;
  }
  // Keep-alive: after a HEAD the next response starts right after its headers (no body was sent).
  raw(s.port(), "HEAD /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Connection: close\r\n\r\n", &wire);
  const size_t first_end = wire.find("\r\n\r\n");
  ASSERT_NE(first_end, std::string::npos);
  EXPECT_EQ(wire.compare(first_end + 4, 12, "HTTP/1.1 200"), 0) << wire;

  auto r = request(s.port(), "GET", "/v1/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(header_of(r, "allow").value_or(""), "POST, OPTIONS");
  r = request(s.port(), "DELETE", "/health");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(header_of(r, "allow").value_or(""), "GET, HEAD, OPTIONS");
  r = raw(s.port(), "HEAD /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(header_of(r, "allow").value_or(""), "POST, OPTIONS");
  EXPECT_EQ(r.body, "");
}

TEST(HttpHardening, Http10ClientsNeverGetChunkedEncoding) {
  TestServer s;
  std::string wire;
  // Streamed: the SSE body runs to the end of the connection.
  auto r = raw(s.port(),
               post_text("/v1/completions", R"({"prompt":"import os","max_tokens":6,"temperature":0,"stream":true})",
                         kJson, "HTTP/1.0"),
               &wire);
  EXPECT_EQ(wire.rfind("HTTP/1.0 200", 0), 0u) << wire;
  EXPECT_FALSE(header_of(r, "transfer-encoding").has_value()) << r.headers;
  EXPECT_FALSE(header_of(r, "content-length").has_value());
  EXPECT_EQ(r.body.rfind("data: {", 0), 0u) << r.body;  // raw events, no chunk sizes
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
  // The telemetry stream too.
  r = raw(s.port(), "GET /v1/telemetry?limit=1 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", &wire);
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(header_of(r, "transfer-encoding").has_value());
  EXPECT_EQ(r.body.rfind("data: {", 0), 0u) << r.body;
  // Not streamed: Content-Length.
  r = raw(s.port(), post_text("/v1/completions", kSmall, kJson, "HTTP/1.0"), &wire);
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(header_of(r, "transfer-encoding").has_value());
  EXPECT_EQ(header_of(r, "content-length").value_or(""), std::to_string(r.body.size()));
  EXPECT_NO_THROW(r.json());
  // HTTP/1.1 streams stay chunked.
  r = raw(s.port(), post_text("/v1/completions", R"({"prompt":"x","max_tokens":2,"stream":true})", kJson), &wire);
  EXPECT_EQ(header_of(r, "transfer-encoding").value_or(""), "chunked");
}

TEST(HttpHardening, EveryResponseCarriesARequestId) {
  TestServer s;
  auto r = request(s.port(), "GET", "/v1/models", {}, "X-Request-Id: client-id-42\r\n");
  EXPECT_EQ(header_of(r, "x-request-id").value_or(""), "client-id-42");
  r = request(s.port(), "GET", "/nowhere", {}, "x-request-id: lost-9\r\n");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(header_of(r, "x-request-id").value_or(""), "lost-9");
  const std::regex generated("^[0-9a-f]{32}$");
  for (const std::string& bad : {std::string(129, 'a'), std::string("caf\xc3\xa9")}) {
    r = request(s.port(), "GET", "/v1/models", {}, "x-request-id: " + bad + "\r\n");
    EXPECT_TRUE(std::regex_match(header_of(r, "x-request-id").value_or(""), generated)) << r.headers;
  }
  r = request(s.port(), "GET", "/health");
  const std::string a = header_of(r, "x-request-id").value_or("");
  EXPECT_TRUE(std::regex_match(a, generated)) << a;
  EXPECT_NE(a, header_of(request(s.port(), "GET", "/health"), "x-request-id").value_or(""));
  // Streams and refusals while reading (garbage, oversized headers) carry one too.
  r = post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":2,"stream":true})", "x-request-id: sse-1\r\n");
  EXPECT_EQ(header_of(r, "x-request-id").value_or(""), "sse-1");
  r = raw(s.port(), "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(std::regex_match(header_of(r, "x-request-id").value_or(""), generated));
}

TEST(HttpHardening, KvPositionsReturnToZeroWhenEveryStreamIsCancelled) {
  ServerOptions o;
  o.scheduler.max_batch = 3;
  o.scheduler.context = 1024;
  TestServer s(o);
  auto slow = std::make_unique<SlowSteps>(s);  // steps of >= 5 ms: the streams are still running when they hang up
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    const int fd = connect_loopback(s.port());
    send_all(fd, post_text("/v1/completions", R"({"prompt":"abc","max_tokens":500,"ignore_eos":true,"stream":true})",
                           kJson));
    char buf[512];
    ASSERT_GT(recv_some(fd, buf, sizeof buf), 0);
    fds.push_back(fd);
  }
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().generated_tokens_total > 2; }));
  EXPECT_GT(s.scheduler().stats().kv_positions_used, 0);
  for (int fd : fds) ::close(fd);
  slow->handle().cancel();
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().sequences_cancelled == 3; }));
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().active == 0; }));
  const auto stats = s.scheduler().stats();
  EXPECT_EQ(stats.kv_positions_used, 0);
  EXPECT_GT(stats.kv_positions_cached, 0);  // their rows stay for prefix reuse
  const auto health = request(s.port(), "GET", "/health").json();
  EXPECT_EQ(health.at("kv").at("positions_used").to_number<int64_t>(), 0);
  EXPECT_EQ(metric(request(s.port(), "GET", "/metrics").body, "tierlm_kv_positions_used"), 0);
}

TEST(HttpHardening, ThreadsInUseIsTheResolvedCount) {
  ServerOptions o;
  o.scheduler.threads = 0;  // auto: one per physical core
  TestServer s(o);
  const auto health = request(s.port(), "GET", "/health").json();
  EXPECT_EQ(health.at("plan").at("threads_in_use").to_number<int64_t>(), kernels::ThreadPool::physical_cores());
  EXPECT_GT(health.at("plan").at("threads_in_use").to_number<int64_t>(), 0);
}

// --- 3. resource limits -------------------------------------------------------------------------------------------

// max_batch 1, queue limit 2: the engine is held in a step with the only slot taken; A and B queue; B hangs up.
// B's place must be free at once (the queue's head A still waits for the slot, so nothing else would remove B).
TEST(HttpHardening, QueuedClientThatHangsUpFreesItsPlaceAtOnce) {
  ServerOptions o;
  o.scheduler.max_batch = 1;
  o.scheduler.queue_limit = 2;
  TestServer s(o);
  EngineGate gate(s);
  auto a = std::async(std::launch::async, [&] { return post(s.port(), "/v1/completions", kSmall); });
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().waiting == 1; }));
  const int b = connect_loopback(s.port());
  send_all(b, post_text("/v1/completions", kSmall, kJson));
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().waiting == 2; }));
  ::close(b);
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().waiting == 1; }, 5)) << "the hung-up request kept its place";
  // C is queued, not refused.
  auto c = std::async(std::launch::async, [&] { return post(s.port(), "/v1/completions", kSmall); });
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().waiting == 2; }, 5));
  EXPECT_EQ(c.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);  // queued, not refused
  gate.release();
  EXPECT_EQ(a.get().status, 200);
  EXPECT_EQ(c.get().status, 200);
  EXPECT_TRUE(eventually([&] { return s.scheduler().stats().sequences_cancelled == 1; }));
}

TEST(HttpHardening, RetryAfterOn429) {
  ServerOptions o;
  o.scheduler.queue_limit = 0;  // every completion is refused
  TestServer s(o);
  auto r = post(s.port(), "/v1/completions", kSmall);
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(error_code(r), "queue_full");
  EXPECT_EQ(header_of(r, "retry-after").value_or(""), "1");
}

TEST(HttpHardening, ConnectionCapAnswers503AndCounts) {
  ServerOptions o;
  o.http.max_connections = 2;
  TestServer s(o);
  const int c1 = connect_loopback(s.port()), c2 = connect_loopback(s.port());
  ASSERT_TRUE(eventually([&] { return s.telemetry().health().at("requests").at("connections").to_number<int64_t>() == 2; }));
  std::string wire;
  auto r = raw(s.port(), "GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", &wire);
  EXPECT_EQ(r.status, 503) << wire;
  EXPECT_EQ(error_code(r), "too_many_connections");
  EXPECT_EQ(header_of(r, "retry-after").value_or(""), "1");
  EXPECT_EQ(header_of(r, "connection").value_or(""), "close");
  ::close(c1);
  ASSERT_TRUE(eventually([&] { return s.telemetry().health().at("requests").at("connections").to_number<int64_t>() == 1; }));
  EXPECT_EQ(request(s.port(), "GET", "/health/live").status, 200);
  ::close(c2);
  ASSERT_TRUE(eventually([&] { return s.telemetry().health().at("requests").at("connections").to_number<int64_t>() == 0; }));
  const std::string metrics = request(s.port(), "GET", "/metrics").body;
  EXPECT_EQ(metric(metrics, R"(tierlm_http_rejected_total{reason="over_capacity"})"), 1) << metrics;
  EXPECT_EQ(metric(metrics, R"(tierlm_http_requests_total{route="other",code="503"})"), 1);
}

// The server shares this process's descriptor table: lower RLIMIT_NOFILE and fill every free descriptor, then let a
// client (its socket made beforehand) connect. accept() fails with EMFILE; the loop must back off (no CPU burnt, a
// log line per few seconds) and serve the waiting client once descriptors are free again.
TEST(HttpHardening, OutOfFileDescriptorsTheAcceptLoopBacksOffAndRecovers) {
  LogCapture log;
  TestServer s;
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  const int base = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(base, 0);
  int highest = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) highest = std::max(highest, std::atoi(e->d_name));
    ::closedir(d);
  }
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = rlim_t(highest + 32);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fillers;
  for (int i = 0; i < 100000; ++i) {
    const int fd = ::dup(base);
    if (fd < 0) break;
    fillers.push_back(fd);
  }
  const int dup_errno = errno;
  struct Restore {
    std::vector<int>& fillers;
    rlimit old;
    ~Restore() {
      for (int fd : fillers) ::close(fd);
      fillers.clear();
      ::setrlimit(RLIMIT_NOFILE, &old);
    }
  } restore{fillers, old};
  ASSERT_EQ(dup_errno, EMFILE);

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(s.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);  // lands in the backlog
  send_all(client, "GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ::getrusage(RUSAGE_SELF, &after);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  const double cpu = seconds(after.ru_utime) - seconds(before.ru_utime) + seconds(after.ru_stime) -
                     seconds(before.ru_stime);
  const size_t lines = log.count("accept failed");
  EXPECT_LT(cpu, 0.25) << "CPU seconds spent in 1 s while accept() fails";
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 2u) << log.all().substr(0, 2000);

  // Descriptors free again: the client waiting in the backlog is served within the back-off (<= 1 s).
  for (int fd : fillers) ::close(fd);
  fillers.clear();
  ::setrlimit(RLIMIT_NOFILE, &old);
  timeval tv{5, 0};
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const auto r = parse_response(read_all(client));
  ::close(client);
  ::close(base);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"status":"ok"})");
  EXPECT_EQ(request(s.port(), "GET", "/health/live").status, 200);
}

// A generation past --request-timeout ends like max_tokens did ("length", what it has); one still queued at its
// deadline gets 503 with Retry-After, and the log line names its x-request-id.
TEST(HttpHardening, RequestDeadline) {
  LogCapture log;
  ServerOptions o;
  o.scheduler.max_batch = 2;
  o.scheduler.context = 1024;
  o.http.request_timeout_seconds = 0.3;
  TestServer s(o);
  {
    SlowSteps slow(s);  // >= 5 ms per step: 400 tokens would take 2 s
    const auto t0 = std::chrono::steady_clock::now();
    auto r = post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":400,"ignore_eos":true})");
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(r.status, 200) << r.body;
    const auto v = r.json();
    EXPECT_EQ(v.at("choices").at(0).at("finish_reason").as_string(), "length");
    EXPECT_GT(v.at("usage").at("completion_tokens").as_int64(), 0);
    EXPECT_LT(v.at("usage").at("completion_tokens").as_int64(), 400);
    EXPECT_LT(took, 1.5);
    // Streamed: the last chunk says "length", then [DONE].
    r = post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":400,"ignore_eos":true,"stream":true})");
    ASSERT_EQ(r.status, 200);
    EXPECT_NE(r.body.find(R"("finish_reason":"length")"), std::string::npos) << r.body;
    EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));
  }
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().active == 0; }));
  {
    // Queued past its deadline (the engine held in a step, so nothing is admitted): 503.
    EngineGate gate(s);
    auto queued = std::async(std::launch::async, [&] {
      return post(s.port(), "/v1/completions", kSmall, "x-request-id: deadline-7\r\n");
    });
    ASSERT_TRUE(eventually([&] { return s.scheduler().stats().waiting == 1; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    gate.release();
    const auto r = queued.get();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(error_code(r), "request_timeout");
    EXPECT_EQ(header_of(r, "retry-after").value_or(""), "1");
    EXPECT_EQ(header_of(r, "x-request-id").value_or(""), "deadline-7");
  }
  EXPECT_EQ(log.count("x-request-id deadline-7"), 1u) << log.all();
  EXPECT_GE(s.scheduler().stats().sequences_timed_out, 3u);
}

TEST(HttpHardening, EveryRefusalIsCountedInMetrics) {
  ServerOptions o;
  o.http.api_key = "k";
  o.http.max_body_bytes = 1024;
  o.scheduler.queue_limit = 0;
  TestServer s(o);
  const std::string key = "Authorization: Bearer k\r\n";
  const uint16_t p = s.port();
  EXPECT_EQ(post(p, "/v1/completions", R"({"prompt":")" + std::string(2048, 'a') + R"("})", key).status, 413);
  EXPECT_EQ(raw(p, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(20000, 'b') + "\r\n\r\n").status,
            431);
  EXPECT_EQ(raw(p, "GARBAGE\r\n\r\n").status, 400);
  EXPECT_EQ(request(p, "GET", "/v1/models").status, 401);
  EXPECT_EQ(raw(p, "GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n" + key + "\r\n").status, 403);
  EXPECT_EQ(raw(p, post_text("/v1/completions", kSmall, kJson + key + "Origin: https://evil.example\r\n")).status, 403);
  EXPECT_EQ(request(p, "GET", "/nowhere", {}, key).status, 404);
  EXPECT_EQ(request(p, "GET", "/v1/completions", {}, key).status, 405);
  EXPECT_EQ(raw(p, post_text("/v1/completions", kSmall, "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n" + key)).status,
            415);
  EXPECT_EQ(post(p, "/v1/completions", kSmall, key).status, 429);
  EXPECT_EQ(post(p, "/v1/completions", "{", key).status, 400);
  const std::string m = request(p, "GET", "/metrics", {}, key).body;
  for (const char* reason : {"body_too_large", "headers_too_large", "malformed_request", "unauthorized",
                             "host_not_allowed", "origin_not_allowed", "not_found", "method_not_allowed",
                             "unsupported_media_type", "queue_full", "invalid_request"})
    EXPECT_EQ(metric(m, std::string("tierlm_http_rejected_total{reason=\"") + reason + "\"}"), 1) << reason;
  // They are in the per-route counters too (the route of the request line when it was read, else "other").
  EXPECT_EQ(metric(m, R"(tierlm_http_requests_total{route="/v1/completions",code="413"})"), 1);
  EXPECT_EQ(metric(m, R"(tierlm_http_requests_total{route="/health",code="431"})"), 1);
  EXPECT_EQ(metric(m, R"(tierlm_http_requests_total{route="other",code="400"})"), 1);
  EXPECT_EQ(metric(m, R"(tierlm_http_requests_total{route="/v1/models",code="401"})"), 1);
  EXPECT_EQ(metric(m, R"(tierlm_http_requests_total{route="/v1/completions",code="415"})"), 1);
  EXPECT_EQ(metric(m, R"(tierlm_http_requests_total{route="/v1/completions",code="429"})"), 1);
  const auto health = request(p, "GET", "/health", {}, key).json();
  EXPECT_EQ(health.at("requests").at("refused_by_reason").at("queue_full").to_number<int64_t>(), 1);
}

}  // namespace
}  // namespace tierlm::server::testing
