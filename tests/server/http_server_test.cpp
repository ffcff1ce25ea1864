// The whole server in-process (scheduler + Beast on a free loopback port, tierlm-tiny model), driven over real
// sockets: routes, SSE streaming, stop strings across tokens, validation errors, auth, queue limit, disconnects.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <future>
#include <regex>
#include <set>
#include <sstream>

#include "calibrate/calibration.h"
#include "tests/server/test_client.h"

namespace tierlm::server::testing {
namespace {

namespace json = boost::json;

TestServer& shared_server() {
  static TestServer* server = [] {
    ServerOptions o;
    o.http.max_body_bytes = 64 * 1024;
    return new TestServer(o);
  }();
  return *server;
}

std::string chat_body(const std::string& content, int max_tokens, const std::string& extra = {}) {
  json::object body;
  body["model"] = "tierlm-tiny";
  body["messages"] = json::array{json::object{{"role", "user"}, {"content", content}}};
  body["max_tokens"] = max_tokens;
  body["temperature"] = 0;
  std::string s = json::serialize(body);
  if (!extra.empty()) s = s.substr(0, s.size() - 1) + "," + extra + "}";
  return s;
}

void expect_error(const HttpResponse& r, int status, const std::string& code = {}, const std::string& param = {}) {
  EXPECT_EQ(r.status, status) << r.body;
  json::value v;
  ASSERT_NO_THROW(v = r.json()) << r.body;
  const auto& e = v.at("error").as_object();
  EXPECT_TRUE(e.at("message").is_string());
  EXPECT_TRUE(e.at("type").is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!code.empty()) {
    EXPECT_EQ(e.at("code").as_string(), code) << r.body;
  }
  if (!param.empty()) {
    EXPECT_EQ(e.at("param").as_string(), param) << r.body;
  }
}

TEST(HttpServer, ModelsHealthWisdomDashboard) {
  auto& s = shared_server();
  auto models = request(s.port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json().at("data").at(0).at("id").as_string(), "tierlm-tiny");

  auto health = request(s.port(), "GET", "/health");
  ASSERT_EQ(health.status, 200);
  auto h = health.json().as_object();
  EXPECT_EQ(h.at("status").as_string(), "ok");
  EXPECT_EQ(h.at("model").at("id").as_string(), "tierlm-tiny");
  EXPECT_TRUE(h.at("plan").is_object());
  EXPECT_GT(h.at("memory").at("accounts").at("weights").at("bytes").to_number<double>(), 0.0);
  EXPECT_GT(h.at("memory").at("accounts").at("kv").at("bytes").to_number<double>(), 0.0);
  EXPECT_GT(h.at("memory").at("rss_bytes").to_number<double>(), 0.0);
  EXPECT_TRUE(h.at("memory").at("cgroup").is_object());
  EXPECT_EQ(h.at("tiering").at("available").as_bool(), false);
  EXPECT_TRUE(h.at("tiering").as_object().contains("disk_bytes_read"));
  EXPECT_TRUE(h.at("tiering").as_object().contains("cache_hit_rate"));
  EXPECT_TRUE(h.at("kv").as_object().contains("positions_used"));
  // KV bytes by codec: this server's page pools are live, so some codec reserves at least the ledger's kv bytes.
  const auto& by_codec = h.at("kv").at("bytes_by_codec").as_object();
  ASSERT_FALSE(by_codec.empty());
  double reserved = 0;
  for (const auto& c : by_codec) {
    reserved += c.value().at("reserved_bytes").to_number<double>();
    EXPECT_LE(c.value().at("used_bytes").to_number<double>(), c.value().at("reserved_bytes").to_number<double>());
  }
  EXPECT_GE(reserved, h.at("memory").at("accounts").at("kv").at("bytes").to_number<double>());
  EXPECT_TRUE(h.at("requests").as_object().contains("in_flight"));
  EXPECT_EQ(h.at("gpu").at("layers").to_number<int64_t>(), 0);  // CPU only: no VRAM numbers
  EXPECT_FALSE(h.at("gpu").as_object().contains("vram"));

  expect_error(request(s.port(), "GET", "/wisdom"), 404, "no_plan");

  auto page = request(s.port(), "GET", "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_NE(page.headers.find("text/html"), std::string::npos);
  EXPECT_NE(page.body.find("<canvas"), std::string::npos);
  EXPECT_NE(page.body.find("/v1/telemetry"), std::string::npos);
  EXPECT_EQ(page.body.find("<script src"), std::string::npos);  // self-contained
  EXPECT_EQ(page.body.find("https://"), std::string::npos);
}

// Prometheus text exposition: HELP then TYPE before each family's samples, valid names, numeric values, counters
// end in _total, histogram buckets cumulative with +Inf == _count.
TEST(HttpServer, MetricsAreValidPrometheusText) {
  auto& s = shared_server();
  ASSERT_EQ(post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":2})").status, 200);
  auto r = request(s.port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/plain; version=0.0.4"), std::string::npos);
  const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)");
  const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$)");
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::string last_help;
  std::map<std::string, double> inf_bucket, counts;
  std::istringstream in(r.body);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      EXPECT_FALSE(helped.count(m[1])) << "HELP twice: " << line;
      helped.insert(m[1]);
      last_help = m[1];
    } else if (std::regex_match(line, m, type)) {
      EXPECT_EQ(m[1], last_help) << "TYPE without HELP first: " << line;
      EXPECT_FALSE(types.count(m[1])) << "TYPE twice: " << line;
      types[m[1]] = m[2];
      if (m[2] == "counter") {
        EXPECT_TRUE(std::string(m[1]).ends_with("_total")) << line;
      }
    } else {
      ASSERT_TRUE(std::regex_match(line, m, sample)) << "bad line: " << line;
      std::string name = m[1];
      const std::string value = m[5];
      EXPECT_NO_THROW((void)std::stod(value)) << line;
      std::string family = name;
      for (const char* suffix : {"_bucket", "_sum", "_count"})
        if (!types.count(family) && family.ends_with(suffix)) family = family.substr(0, family.size() - strlen(suffix));
      ASSERT_TRUE(types.count(family)) << "sample before its TYPE: " << line;
      if (name.ends_with("_bucket") && line.find("le=\"+Inf\"") != std::string::npos)
        inf_bucket[line.substr(line.find('{'), line.find("le=") - line.find('{'))] = std::stod(value);
      if (name.ends_with("_count")) counts["{" + line.substr(line.find('{') + 1, line.find('}') - line.find('{') - 1) + ","] = std::stod(value);
      ++samples;
    }
  }
  EXPECT_GT(samples, 20);
  for (const char* needed : {"tierlm_memory_bytes", "tierlm_process_resident_memory_bytes", "tierlm_requests_in_flight",
                             "tierlm_generation_tokens_total", "tierlm_kv_positions_used",
                             "tierlm_http_request_duration_seconds", "tierlm_disk_read_bytes_total",
                             "tierlm_expert_cache_hits_total", "tierlm_kv_codec_reserved_bytes",
                             "tierlm_kv_codec_used_bytes", "tierlm_gpu_layers"})
    EXPECT_TRUE(types.count(needed)) << needed;
  EXPECT_EQ(types["tierlm_http_request_duration_seconds"], "histogram");
  for (const auto& [labels, inf] : inf_bucket) EXPECT_EQ(inf, counts[labels]) << labels;
}

TEST(HttpServer, ChatAndCompletionNonStreaming) {
  auto& s = shared_server();
  // The default model ends its chat turns itself (<|im_end|>, usually within a dozen tokens): that is a "stop" with
  // fewer tokens than asked; with ignore_eos it runs to max_tokens, a "length".
  auto natural = post(s.port(), "/v1/chat/completions", chat_body("def add(a, b):", 64));
  ASSERT_EQ(natural.status, 200) << natural.body;
  EXPECT_EQ(natural.json().at("choices").at(0).at("finish_reason").as_string(), "stop");
  EXPECT_LT(natural.json().at("usage").at("completion_tokens").as_int64(), 64);
  auto r = post(s.port(), "/v1/chat/completions", chat_body("def add(a, b):", 12, R"("ignore_eos":true)"));
  ASSERT_EQ(r.status, 200) << r.body;
  auto v = r.json().as_object();
  EXPECT_EQ(v.at("object").as_string(), "chat.completion");
  EXPECT_EQ(v.at("model").as_string(), "tierlm-tiny");
  const auto& choice = v.at("choices").at(0).as_object();
  EXPECT_EQ(choice.at("message").at("role").as_string(), "assistant");
  EXPECT_TRUE(choice.at("message").at("content").is_string());
  EXPECT_EQ(choice.at("finish_reason").as_string(), "length");
  EXPECT_EQ(v.at("usage").at("completion_tokens").as_int64(), 12);
  EXPECT_GT(v.at("usage").at("prompt_tokens").as_int64(), 3);
  EXPECT_EQ(v.at("usage").at("total_tokens").as_int64(),
            v.at("usage").at("prompt_tokens").as_int64() + v.at("usage").at("completion_tokens").as_int64());

  auto c = post(s.port(), "/v1/completions", R"({"prompt":"def add(a, b):","max_tokens":5,"temperature":0,"logprobs":2})");
  ASSERT_EQ(c.status, 200) << c.body;
  auto cv = c.json().as_object();
  EXPECT_EQ(cv.at("object").as_string(), "text_completion");
  const auto& lp = cv.at("choices").at(0).at("logprobs").as_object();
  EXPECT_EQ(lp.at("tokens").as_array().size(), 5u);
  EXPECT_EQ(lp.at("top_logprobs").at(0).as_object().size(), 2u);
  std::string joined;
  for (const auto& t : lp.at("tokens").as_array()) joined += t.as_string();
  EXPECT_EQ(joined, cv.at("choices").at(0).at("text").as_string());

  // Chat logprobs: the chosen (greedy) token is the best of top_logprobs.
  auto l = post(s.port(), "/v1/chat/completions", chat_body("hello", 3, R"("logprobs":true,"top_logprobs":3)"));
  ASSERT_EQ(l.status, 200) << l.body;
  const json::value lv = l.json();
  const auto& content = lv.at("choices").at(0).at("logprobs").at("content").as_array();
  ASSERT_EQ(content.size(), 3u);
  for (const auto& e : content) {
    EXPECT_EQ(e.at("top_logprobs").as_array().size(), 3u);
    EXPECT_EQ(e.at("top_logprobs").at(0).at("token"), e.at("token"));
    EXPECT_LE(e.at("logprob").as_double(), 0.0);
  }
}

TEST(HttpServer, StreamingMatchesNonStreamingAndReportsUsage) {
  auto& s = shared_server();
  auto full = post(s.port(), "/v1/chat/completions", chat_body("class Stack:", 20, R"("ignore_eos":true)"));
  ASSERT_EQ(full.status, 200);
  const std::string expected = std::string(full.json().at("choices").at(0).at("message").at("content").as_string());

  auto r = post(s.port(), "/v1/chat/completions",
                chat_body("class Stack:", 20, R"("ignore_eos":true,"stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos);
  auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  auto first = json::parse(events[0]);
  EXPECT_EQ(first.at("object").as_string(), "chat.completion.chunk");
  EXPECT_EQ(first.at("choices").at(0).at("delta").at("role").as_string(), "assistant");
  std::string text;
  std::string finish;
  json::value usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    auto e = json::parse(events[i]).as_object();
    if (e.at("choices").as_array().empty()) {
      usage = e.at("usage");
      continue;
    }
    EXPECT_TRUE(e.at("usage").is_null());  // include_usage: null on every chunk but the last
    const auto& ch = e.at("choices").at(0).as_object();
    if (auto* c = ch.at("delta").as_object().if_contains("content")) text += c->as_string();
    if (!ch.at("finish_reason").is_null()) finish = ch.at("finish_reason").as_string();
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(finish, "length");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage.at("completion_tokens").as_int64(), 20);

  // Completions stream, no usage requested: no usage chunk, no usage field.
  auto c = post(s.port(), "/v1/completions", R"({"prompt":"import os","max_tokens":6,"temperature":0,"stream":true})");
  ASSERT_EQ(c.status, 200);
  auto ce = sse_events(c.body);
  ASSERT_GE(ce.size(), 2u);
  EXPECT_EQ(ce.back(), "[DONE]");
  for (size_t i = 0; i + 1 < ce.size(); ++i) {
    auto e = json::parse(ce[i]).as_object();
    EXPECT_EQ(e.at("object").as_string(), "text_completion");
    EXPECT_FALSE(e.contains("usage"));
  }
}

// A stop string made of the end of one token and the start of the next must match and never be sent.
TEST(HttpServer, StopStringsAcrossTokenBoundaries) {
  auto& s = shared_server();
  const std::string prompt = R"({"prompt":"def parse(text):\n    \"\"\"","max_tokens":40,"temperature":0,"logprobs":0)";
  auto base = post(s.port(), "/v1/completions", prompt + "}");
  ASSERT_EQ(base.status, 200) << base.body;
  const json::value base_json = base.json();
  const auto& choice = base_json.at("choices").at(0);
  const std::string text(choice.at("text").as_string());
  std::vector<std::string> tokens;
  for (const auto& t : choice.at("logprobs").at("tokens").as_array()) tokens.emplace_back(t.as_string());
  // Pick a boundary where both sides are plain ASCII text and the 2-byte stop first occurs right there.
  std::string stop;
  size_t offset = 0, cut_at = 0;
  for (size_t i = 0; i + 1 < tokens.size() && stop.empty(); ++i) {
    offset += tokens[i].size();
    if (tokens[i].empty() || tokens[i + 1].empty()) continue;
    const std::string candidate = tokens[i].substr(tokens[i].size() - 1) + tokens[i + 1].substr(0, 1);
    if (static_cast<unsigned char>(candidate[0]) >= 0x80 || static_cast<unsigned char>(candidate[1]) >= 0x80) continue;
    if (text.find(candidate) == offset - 1) {
      stop = candidate;
      cut_at = offset - 1;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no usable token boundary in: " << text;
  json::object extra;
  extra["stop"] = json::array{json::value(stop), json::value("never-appears-XYZ")};
  const std::string stop_json = json::serialize(extra);
  const std::string with_stop = prompt + "," + stop_json.substr(1, stop_json.size() - 2);
  auto r = post(s.port(), "/v1/completions", with_stop + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json().at("choices").at(0).at("text").as_string(), text.substr(0, cut_at)) << "stop " << stop;
  EXPECT_EQ(r.json().at("choices").at(0).at("finish_reason").as_string(), "stop");

  auto streamed = post(s.port(), "/v1/completions", with_stop + R"(,"stream":true})");
  std::string joined;
  for (const auto& e : sse_events(streamed.body))
    if (e != "[DONE]") joined += json::parse(e).at("choices").at(0).at("text").as_string();
  EXPECT_EQ(joined, text.substr(0, cut_at));
  EXPECT_EQ(joined.find(stop), std::string::npos);
}

TEST(HttpServer, InvalidRequestsGet4xxAndTheServerKeepsServing) {
  auto& s = shared_server();
  const uint16_t p = s.port();
  expect_error(post(p, "/v1/chat/completions", "{\"messages\": [{"), 400, "invalid_json");
  expect_error(post(p, "/v1/chat/completions", "not json at all"), 400, "invalid_json");
  expect_error(post(p, "/v1/chat/completions", ""), 400, "invalid_json");
  expect_error(post(p, "/v1/chat/completions", R"({"messages":"hello"})"), 400, "invalid_type", "messages");
  expect_error(post(p, "/v1/chat/completions", chat_body("x", 5, R"("temperature":"warm")")), 400, "invalid_type",
               "temperature");
  expect_error(post(p, "/v1/chat/completions", chat_body("x", 5, R"("n":17)")), 400, "invalid_value", "n");
  expect_error(post(p, "/v1/chat/completions", chat_body("x", 5, R"("store":true)")), 400, "unknown_parameter", "store");
  expect_error(post(p, "/v1/completions", R"({"prompt":"x","model":"gpt-4"})"), 404, "model_not_found", "model");
  // Too many tokens: prompt + max_tokens beyond the 512-position context.
  expect_error(post(p, "/v1/completions", R"({"prompt":"hello world","max_tokens":600})"), 400,
               "context_length_exceeded", "prompt");
  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "alpha beta gamma ";
  expect_error(post(p, "/v1/completions", R"({"prompt":")" + long_prompt + R"("})"), 400, "context_length_exceeded");
  expect_error(post(p, "/v1/completions", R"({"prompt":[1,2,99999]})"), 400);
  // Oversized body (limit 64 KiB here).
  const std::string huge = R"({"prompt":")" + std::string(100 * 1024, 'a') + R"("})";
  expect_error(post(p, "/v1/completions", huge), 413, "request_too_large");
  expect_error(request(p, "GET", "/v1/nothing"), 404, "unknown_url");
  expect_error(request(p, "GET", "/v1/chat/completions"), 405, "method_not_allowed");
  expect_error(request(p, "DELETE", "/health"), 405);
  // Garbage on the wire.
  {
    const int fd = connect_loopback(p);
    send_all(fd, "THIS IS NOT HTTP\r\n\r\n");
    auto r = parse_response(read_all(fd));
    ::close(fd);
    EXPECT_EQ(r.status, 400);
  }
  auto ok = post(p, "/v1/chat/completions", chat_body("still there?", 3));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(request(p, "GET", "/health").status, 200);
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  auto& s = shared_server();
  const int fd = connect_loopback(s.port());
  const std::string body = R"({"prompt":"x","max_tokens":2,"temperature":0})";
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  std::string last = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  send_all(fd, req + req + last);  // pipelined
  const std::string raw = read_all(fd);
  ::close(fd);
  size_t n = 0, pos = 0;
  while ((pos = raw.find("HTTP/1.1 200", pos)) != std::string::npos) ++n, ++pos;
  EXPECT_EQ(n, 3u) << raw;
}

TEST(HttpServer, TelemetryStreamSendsSnapshots) {
  auto& s = shared_server();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = request(s.port(), "GET", "/v1/telemetry?limit=2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos);
  auto events = sse_events(r.body);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_GE(seconds, 0.9);  // one per second
  auto e = json::parse(events[1]).as_object();
  EXPECT_GT(e.at("memory").at("weights").to_number<double>(), 0.0);
  EXPECT_TRUE(e.contains("generation_tokens_per_second"));
  EXPECT_TRUE(e.contains("hit_rate"));
  EXPECT_GT(e.at("rss_bytes").to_number<double>(), 0.0);
}

TEST(HttpServer, ConcurrentRequestsAreBatchedAndPrefixCacheHits) {
  auto& s = shared_server();
  const auto before = s.scheduler().stats();
  std::vector<std::future<HttpResponse>> fs;
  for (int i = 0; i < 4; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      return post(s.port(), "/v1/completions",
                  R"({"prompt":"def f)" + std::to_string(i) + R"((x):","max_tokens":48,"ignore_eos":true,"temperature":0})");
    }));
  for (auto& f : fs) {
    auto r = f.get();
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json().at("usage").at("completion_tokens").as_int64(), 48);
  }
  const auto after = s.scheduler().stats();
  const double rows = double(after.batched_rows_total - before.batched_rows_total);
  const double steps = double(after.steps_total - before.steps_total);
  EXPECT_GT(rows / steps, 1.5) << "mean batch over the 4 concurrent requests";

  // The same conversation twice: the second reuses the KV rows of the first's prompt.
  const std::string body = chat_body("Write a function that reverses a list in place.", 4);
  ASSERT_EQ(post(s.port(), "/v1/chat/completions", body).status, 200);
  auto second = post(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(second.status, 200);
  const json::value second_json = second.json();
  const auto& usage = second_json.at("usage");
  EXPECT_EQ(usage.at("prompt_tokens_details").at("cached_tokens").as_int64(),
            usage.at("prompt_tokens").as_int64() - 1);
}

// Waits until pred() or the deadline.
template <class F>
bool eventually(F pred, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

TEST(HttpServer, ClientDisconnectCancelsGeneration) {
  ServerOptions o;
  o.scheduler.max_batch = 2;
  TestServer s(o);
  // Streaming: read the first event, then hang up.
  {
    const int fd = connect_loopback(s.port());
    const std::string body = R"({"prompt":"x","max_tokens":500,"ignore_eos":true,"stream":true})";
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
    char buf[512];
    ASSERT_GT(recv_some(fd, buf, sizeof buf), 0);
    ::close(fd);
  }
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().sequences_cancelled == 1; }));
  // Non-streaming: hang up right after sending.
  {
    const int fd = connect_loopback(s.port());
    const std::string body = R"({"prompt":"y","max_tokens":500,"ignore_eos":true})";
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
    ASSERT_TRUE(eventually([&] { return s.scheduler().stats().generated_tokens_total > 0 ||
                                        s.scheduler().stats().active > 0; }));
    ::close(fd);
  }
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().sequences_cancelled == 2; }));
  EXPECT_LT(s.scheduler().stats().generated_tokens_total, 1000u);  // neither ran to its 500 tokens
  EXPECT_EQ(s.scheduler().stats().active, 0);
  EXPECT_EQ(post(s.port(), "/v1/completions", R"({"prompt":"z","max_tokens":2})").status, 200);
}

TEST(HttpServer, QueueLimitAnswers429) {
  ServerOptions o;
  o.scheduler.max_batch = 1;
  o.scheduler.queue_limit = 1;
  TestServer s(o);
  // Occupy the only slot with a stream we hold open.
  const int holder = connect_loopback(s.port());
  const std::string body = R"({"prompt":"x","max_tokens":500,"ignore_eos":true,"stream":true})";
  send_all(holder, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body);
  char buf[256];
  ASSERT_GT(recv_some(holder, buf, sizeof buf), 0);
  // (The stream's headers can come before the scheduler admits it: wait until it holds the slot, or the next
  // request would find the holder itself in the queue and be refused.)
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().active == 1 && s.scheduler().stats().waiting == 0; }));
  // One more waits in the queue...
  auto queued = std::async(std::launch::async, [&] {
    return post(s.port(), "/v1/completions", R"({"prompt":"q","max_tokens":2})");
  });
  ASSERT_TRUE(eventually([&] { return s.scheduler().stats().waiting == 1; }));
  // ...and the next is refused.
  auto refused = post(s.port(), "/v1/completions", R"({"prompt":"r","max_tokens":2})");
  expect_error(refused, 429, "queue_full");
  ::close(holder);  // frees the slot: the queued request completes
  EXPECT_EQ(queued.get().status, 200);
  auto metrics = request(s.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("tierlm_requests_rejected_total 1"), std::string::npos);
}

TEST(HttpServer, BearerApiKey) {
  ServerOptions o;
  o.http.api_key = "sekret-123";
  TestServer s(o);
  expect_error(post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})"), 401, "invalid_api_key");
  expect_error(post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})", "Authorization: Bearer wrong\r\n"),
               401, "invalid_api_key");
  expect_error(request(s.port(), "GET", "/v1/models"), 401);
  expect_error(request(s.port(), "GET", "/metrics"), 401);
  EXPECT_EQ(post(s.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})", "Authorization: Bearer sekret-123\r\n")
                .status,
            200);
  expect_error(request(s.port(), "GET", "/health"), 401);  // the full health report needs the key...
  EXPECT_EQ(request(s.port(), "GET", "/health", {}, "Authorization: Bearer sekret-123\r\n").status, 200);
  EXPECT_EQ(request(s.port(), "GET", "/health/live").body, R"({"status":"ok"})");  // ...the liveness probe does not
  EXPECT_EQ(request(s.port(), "GET", "/").status, 200);  // the dashboard's static page (its data routes need the key)
  expect_error(request(s.port(), "GET", "/v1/telemetry?limit=1"), 401);
  EXPECT_EQ(request(s.port(), "GET", "/v1/telemetry?limit=1&api_key=sekret-123").status, 200);
}

// The chat template (tests/server/fixtures/chatml.jinja via runtime/template) decides the prompt tokens.
TEST(HttpServer, ChatPromptIsTheRenderedTemplate) {
  auto& s = shared_server();
  auto r = post(s.port(), "/v1/chat/completions", R"({"messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Sum?"}],
      "max_tokens":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nSum?<|im_end|>\n"
                               "<|im_start|>assistant\n";
  EXPECT_EQ(r.json().at("usage").at("prompt_tokens").as_int64(), int64_t(s.tokenizer().encode(expected, false).size()));
}

// n choices run as n sequences (batched by the scheduler); streamed chunks carry each choice's index.
TEST(HttpServer, SeveralChoicesStreamedAndNot) {
  auto& s = shared_server();
  const std::string body = chat_body("def add(a, b):", 8, R"("n":3,"temperature":1,"seed":5)");
  auto r = post(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json::value doc = r.json();
  const auto& choices = doc.at("choices").as_array();
  ASSERT_EQ(choices.size(), 3u);
  std::vector<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(choices[i].at("index").as_int64(), int64_t(i));
    texts.emplace_back(choices[i].at("message").at("content").as_string());
  }
  int64_t completion = doc.at("usage").at("completion_tokens").as_int64();
  EXPECT_GE(completion, 3);
  auto streamed = post(s.port(), "/v1/chat/completions", body.substr(0, body.size() - 1) + R"(,"stream":true})");
  std::vector<std::string> joined(3);
  for (const auto& e : sse_events(streamed.body)) {
    if (e == "[DONE]") continue;
    const json::value chunk = json::parse(e);
    for (const auto& c : chunk.at("choices").as_array())
      if (const auto* content = c.at("delta").as_object().if_contains("content"))
        joined[size_t(c.at("index").as_int64())] += content->as_string();
  }
  EXPECT_EQ(joined, texts);
}

TEST(HttpServer, ModelById) {
  auto& s = shared_server();
  auto r = request(s.port(), "GET", "/v1/models/tierlm-tiny");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json().at("id").as_string(), "tierlm-tiny");
  EXPECT_EQ(r.json().at("object").as_string(), "model");
  expect_error(request(s.port(), "GET", "/v1/models/gpt-4o"), 404, "model_not_found", "model");
  expect_error(request(s.port(), "GET", "/v1/models/a/b"), 404, "unknown_url");
}

// A thinking template: its generation prompt opens <think>, so the output is reasoning until </think>; the kwargs
// reach the template (enable_thinking false closes the block in the prompt, reasoning_effort is written into it).
TEST(HttpServer, ReasoningAndTemplateKwargs) {
  ServerOptions o;
  o.chat_template_file = std::string(TIERLM_SOURCE_DIR) + "/tests/server/fixtures/thinking.jinja";
  TestServer s(o);
  auto thinking = post(s.port(), "/v1/chat/completions", chat_body("def add(a, b):", 8));
  ASSERT_EQ(thinking.status, 200) << thinking.body;
  const json::value thinking_doc = thinking.json();
  const auto& m = thinking_doc.at("choices").at(0).at("message").as_object();
  ASSERT_TRUE(m.contains("reasoning_content")) << thinking.body;
  EXPECT_FALSE(m.at("reasoning_content").as_string().empty());
  EXPECT_EQ(m.at("content").as_string(), "");  // the tiny model never closes </think>
  auto streamed = post(s.port(), "/v1/chat/completions", chat_body("def add(a, b):", 8, R"("stream":true)"));
  std::string reasoning;
  for (const auto& e : sse_events(streamed.body)) {
    if (e == "[DONE]") continue;
    const json::value chunk = json::parse(e);
    const auto& d = chunk.at("choices").at(0).at("delta").as_object();
    if (d.contains("reasoning_content")) reasoning += d.at("reasoning_content").as_string();
    if (d.contains("content")) {
      EXPECT_EQ(d.at("content").as_string(), "");
    }
  }
  EXPECT_EQ(reasoning, m.at("reasoning_content").as_string());

  auto plain = post(s.port(), "/v1/chat/completions",
                    chat_body("def add(a, b):", 8, R"("chat_template_kwargs":{"enable_thinking":false})"));
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json::value plain_doc = plain.json();
  const auto& pm = plain_doc.at("choices").at(0).at("message").as_object();
  EXPECT_FALSE(pm.contains("reasoning_content"));
  EXPECT_FALSE(pm.at("content").as_string().empty());
  const std::string base = "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n";
  auto tokens = [&](const std::string& t) { return int64_t(s.tokenizer().encode(t, false).size()); };
  EXPECT_EQ(thinking.json().at("usage").at("prompt_tokens").as_int64(), tokens(base + "<think>\n"));
  EXPECT_EQ(plain.json().at("usage").at("prompt_tokens").as_int64(), tokens(base + "<think>\n\n</think>\n\n"));
  auto effort = post(s.port(), "/v1/chat/completions", chat_body("def add(a, b):", 1, R"("reasoning_effort":"high")"));
  EXPECT_EQ(effort.json().at("usage").at("prompt_tokens").as_int64(), tokens(base + "Reasoning: high\n<think>\n"));
}

// The Anthropic Messages route over the same engine: a message, the streamed event sequence, count_tokens, errors in
// Anthropic's shape, and x-api-key next to Bearer.
TEST(HttpServer, AnthropicMessages) {
  ServerOptions o;
  o.http.api_key = "sekret-9";
  TestServer s(o);
  const std::string key = "x-api-key: sekret-9\r\nanthropic-version: 2023-06-01\r\n";
  const std::string body = R"({"model":"tierlm-tiny","max_tokens":8,"temperature":0,"system":"Be brief.",
      "messages":[{"role":"user","content":"def add(a, b):"}]})";
  auto r = post(s.port(), "/v1/messages", body, key);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto m = r.json();
  EXPECT_EQ(m.at("type").as_string(), "message");
  EXPECT_EQ(m.at("content").at(0).at("type").as_string(), "text");
  const std::string text(m.at("content").at(0).at("text").as_string());
  const std::string stop_reason(m.at("stop_reason").as_string());
  EXPECT_TRUE(stop_reason == "end_turn" || stop_reason == "max_tokens") << r.body;
  auto count = post(s.port(), "/v1/messages/count_tokens", R"({"model":"tierlm-tiny","system":"Be brief.",
      "messages":[{"role":"user","content":"def add(a, b):"}]})", key);
  ASSERT_EQ(count.status, 200) << count.body;
  EXPECT_EQ(count.json().at("input_tokens"), m.at("usage").at("input_tokens"));

  auto streamed = post(s.port(), "/v1/messages", body.substr(0, body.size() - 1) + R"(,"stream":true})", key);
  ASSERT_EQ(streamed.status, 200);
  std::vector<std::string> names;
  std::string joined;
  std::istringstream in(streamed.body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("event: ", 0) == 0) names.push_back(line.substr(7));
    if (line.rfind("data: ", 0) == 0) {
      const auto d = json::parse(line.substr(6));
      EXPECT_EQ(d.at("type").as_string(), names.back());
      if (names.back() == "content_block_delta") joined += d.at("delta").at("text").as_string();
    }
  }
  ASSERT_GE(names.size(), 5u) << streamed.body;
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[1], "content_block_start");
  EXPECT_EQ(names[names.size() - 3], "content_block_stop");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(joined, text);

  auto wrong = post(s.port(), "/v1/messages", body, "x-api-key: nope\r\n");
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(wrong.json().at("type").as_string(), "error");
  EXPECT_EQ(wrong.json().at("error").at("type").as_string(), "authentication_error");
  auto unknown = post(s.port(), "/v1/messages", R"({"model":"claude-x","max_tokens":8,"messages":[{"role":"user",
      "content":"hi"}]})", key);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.json().at("error").at("type").as_string(), "not_found_error");
  auto bad = post(s.port(), "/v1/messages", R"({"model":"tierlm-tiny","messages":[{"role":"user","content":"hi"}]})", key);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json().at("error").at("type").as_string(), "invalid_request_error");
}

TEST(HttpServer, ChatWithoutAnyTemplateIsAClear400) {
  // tierlm-tiny ships a chat template (chat_template.jinja): a copy of the folder without it has none.
  const auto dir = std::filesystem::temp_directory_path() / ("tierlm-no-template-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const auto& f : std::filesystem::directory_iterator(tiny_model_dir()))
    if (f.path().filename() != "chat_template.jinja")
      std::filesystem::create_symlink(f.path(), dir / f.path().filename());
  struct Remove {
    std::filesystem::path dir;
    ~Remove() { std::filesystem::remove_all(dir); }
  } remove{dir};
  ServerOptions o;
  o.model_dir = dir.string();
  o.chat_template = false;
  TestServer s(o);
  expect_error(post(s.port(), "/v1/chat/completions", chat_body("hi", 2)), 400, "no_chat_template", "messages");
  EXPECT_EQ(post(s.port(), "/v1/completions", R"({"prompt":"hi","max_tokens":2})").status, 200);
}

// Last: makes a plan active for the rest of the process.
TEST(HttpServer, WisdomPublishesTheActivePlan) {
  auto& s = shared_server();
  calibrate::WisdomEntry entry;
  entry.plan.device_fingerprint = "test-device";
  entry.plan.model_fingerprint = "test-model";
  entry.plan.threads = 3;
  entry.plan.kv_codec = "q8";
  calibrate::set_active_plan(entry);
  auto r = request(s.port(), "GET", "/wisdom");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json(), calibrate::active_plan_json());
  auto h = request(s.port(), "GET", "/health").json();
  EXPECT_EQ(h.at("plan").at("status").as_string(), "active");
  EXPECT_EQ(h.at("plan").at("device_fingerprint").as_string(), "test-device");
  EXPECT_EQ(h.at("plan").at("threads").as_int64(), 3);
  EXPECT_EQ(h.at("plan").at("kv_codec").as_string(), "q8");
}

}  // namespace
}  // namespace tierlm::server::testing
