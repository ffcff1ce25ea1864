#include "server/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <variant>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "server/anthropic_messages.h"
#include "server/api_error.h"
#include "server/completion_writer.h"
#include "server/dashboard.h"
#include "server/http_request_reading.h"
#include "server/log_throttle.h"
#include "server/request_policy.h"
#include "server/responses_api.h"
#include "server/service.h"

namespace tierlm::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using namespace net::experimental::awaitable_operators;
constexpr auto nothrow = net::as_tuple(use_awaitable);
using Clock = std::chrono::steady_clock;
using Request = HttpRequest;

namespace {

constexpr int kRetryAfterSeconds = 1;                    // on every 429 and 503
constexpr auto kWriteTimeout = std::chrono::seconds(60); // a client that stops reading does not hold us forever
constexpr int kMaxRefusing = 64;                         // over-cap connections being answered 503 at once

// Wakes a connection's coroutine from the engine thread. The posted handler sets the timer's expiry in the past,
// which both interrupts a wait in progress and makes the next wait return at once, so no wakeup is lost while the
// coroutine is busy writing. close() (connection gone, or server stopping) turns further wakeups into no-ops.
struct Wakeup {
  std::mutex mutex;
  bool open = true;
  std::shared_ptr<net::steady_timer> timer;
  void fire() {
    std::lock_guard lock(mutex);
    if (!open) return;
    net::post(timer->get_executor(), [t = timer] { t->expires_at(Clock::time_point::min()); });
  }
  void close() {
    std::lock_guard lock(mutex);
    open = false;
  }
};

// One request/response exchange as the writers need it.
struct Exchange {
  unsigned version = 11;
  bool keep_alive = false;
  bool head = false;           // HEAD: headers only
  std::string request_id;
  std::string cors_origin;     // non-empty: Access-Control-Allow-Origin
  std::string allow;           // Allow header for 405 and OPTIONS
  std::string route = "other";
  bool anthropic = false;      // errors in Anthropic's shape (the /v1/messages routes)
  int status = 0;
  std::string refusal;         // non-empty: counted in tierlm_http_rejected_total{reason}
  bool chunked() const { return version >= 11; }
};

template <class Body>
void common_headers(http::response<Body>& res, const Exchange& ex) {
  res.set(http::field::server, "tierlm");
  res.set("x-request-id", ex.request_id);
  const unsigned status = res.result_int();
  if (status == 429 || status == 503) res.set(http::field::retry_after, std::to_string(kRetryAfterSeconds));
  if (status == 401) res.set(http::field::www_authenticate, "Bearer realm=\"tierlm\"");
  if (status == 405 && !ex.allow.empty()) res.set(http::field::allow, ex.allow);
  if (!ex.cors_origin.empty()) {
    res.set(http::field::access_control_allow_origin, ex.cors_origin);
    res.set(http::field::vary, "Origin");
    res.set(http::field::access_control_expose_headers, "x-request-id, Retry-After");
  }
}

// The metrics label of an error the service threw.
std::string refusal_of(const ApiError& e) {
  switch (e.status()) {
    case 400: return "invalid_request";
    case 404: return "model_not_found";
    case 429: return "queue_full";
    default: return e.status() >= 500 ? std::string() : "invalid_request";
  }
}

std::string sse(std::string_view data) { return fmt::format("data: {}\n\n", data); }

}  // namespace

struct HttpServer::Impl {
  Service& service;
  HttpServerOptions options;
  RequestPolicy policy;
  // Declared before the io_context: connection frames destroyed with it still unregister here.
  std::mutex live_mutex;
  std::set<std::shared_ptr<Wakeup>> live_wakeups;
  std::set<std::shared_ptr<engine::SequenceHandle>> live_handles;
  bool stopped = false;
  std::atomic<int> connections{0};  // sessions being served (the cap counts these)
  std::atomic<int> refusing{0};     // over-cap connections being answered 503
  LogThrottle accept_log{std::chrono::seconds(5)};
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;

  Impl(Service& s, const HttpServerOptions& o)
      : service(s), options(o), policy(make_policy(o.allowed_hosts, o.cors_origins, o.host, o.api_key)),
        ioc(std::max(1, o.io_threads)), acceptor(ioc) {
    if (o.max_connections < 1) throw std::runtime_error("serve: --max-connections must be at least 1");
    boost::system::error_code ec;
    const auto address = net::ip::make_address(o.host, ec);
    if (ec) throw std::runtime_error(fmt::format("serve: '{}' is not an IP address", o.host));
    tcp::endpoint endpoint(address, o.port);
    acceptor.open(endpoint.protocol());
    acceptor.set_option(net::socket_base::reuse_address(true));
    acceptor.bind(endpoint, ec);
    if (ec) throw std::runtime_error(fmt::format("serve: cannot bind {}:{}: {}", o.host, o.port, ec.message()));
    acceptor.listen(net::socket_base::max_listen_connections);
  }

  // Everything a connection ties to the engine is registered so stop() can cut it loose.
  struct Tie {
    Impl& impl;
    std::shared_ptr<Wakeup> wakeup;
    std::vector<std::shared_ptr<engine::SequenceHandle>> handles;
    Tie(Impl& i, std::shared_ptr<Wakeup> w) : impl(i), wakeup(std::move(w)) {
      std::lock_guard lock(impl.live_mutex);
      impl.live_wakeups.insert(wakeup);
    }
    void add_handle(std::shared_ptr<engine::SequenceHandle> h) {
      handles.push_back(h);
      std::lock_guard lock(impl.live_mutex);
      impl.live_handles.insert(std::move(h));
    }
    ~Tie() {
      wakeup->close();
      for (auto& h : handles) h->cancel();  // no effect once the sequence has finished
      std::lock_guard lock(impl.live_mutex);
      impl.live_wakeups.erase(wakeup);
      for (auto& h : handles) impl.live_handles.erase(h);
    }
  };

  void record(const Exchange& ex, Clock::time_point t0) {
    service.telemetry().record_request(ex.route, ex.status, std::chrono::duration<double>(Clock::now() - t0).count());
    if (!ex.refusal.empty()) service.telemetry().record_refusal(ex.refusal);
  }

  // Out of file descriptors (or kernel memory) a failed accept() leaves the connection in the backlog, so the
  // listening socket stays readable and an immediate retry fails again: wait, doubling from 10 ms to 1 s, and log
  // at most one line per 5 s.
  awaitable<void> accept_loop() {
    net::steady_timer backoff_timer(acceptor.get_executor());
    std::chrono::milliseconds backoff{0};
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(net::make_strand(ioc), nothrow);
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
        // A connection that died in the backlog is that connection's problem: take the next one.
        if (ec == net::error::connection_aborted || ec == net::error::connection_reset) continue;
        backoff = std::clamp(backoff * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
        if (auto held = accept_log.allow())
          spdlog::warn("[server] accept failed: {}; retrying in {} ms ({} more such failures in the last 5 s)",
                       ec.message(), backoff.count(), *held);
        backoff_timer.expires_after(backoff);
        co_await backoff_timer.async_wait(nothrow);
        continue;
      }
      backoff = std::chrono::milliseconds(0);
      if (connections.load() >= options.max_connections) {
        // Over the cap: answer 503 (Retry-After) and close, on a coroutine of its own; beyond kMaxRefusing of those
        // at once, just close.
        if (refusing.fetch_add(1) < kMaxRefusing) {
          auto executor = socket.get_executor();
          net::co_spawn(executor, refuse_connection(std::move(socket)), net::detached);
        } else {
          refusing.fetch_sub(1);
          Exchange ex;
          ex.status = 503;
          ex.refusal = "over_capacity";
          record(ex, Clock::now());
          boost::system::error_code ignored;
          socket.close(ignored);
        }
        continue;
      }
      connections.fetch_add(1);
      auto executor = socket.get_executor();
      net::co_spawn(executor, session(std::move(socket)), [](std::exception_ptr e) {
        if (!e) return;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          spdlog::error("[server] connection failed: {}", x.what());
        }
      });
    }
  }

  awaitable<void> refuse_connection(tcp::socket socket) {
    struct Done {
      std::atomic<int>& n;
      ~Done() { n.fetch_sub(1); }
    } done{refusing};
    beast::tcp_stream stream(std::move(socket));
    Exchange ex;
    ex.request_id = request_id(std::nullopt);
    const auto t0 = Clock::now();
    co_await send_error(stream, ex,
                        ApiError(503, fmt::format("The server has too many open connections (limit {}). Retry later.",
                                                  options.max_connections),
                                 "server_overloaded", {}, "too_many_connections"),
                        "over_capacity");
    record(ex, t0);
    // Read (and drop) what the client sent before closing, briefly: closing with unread data would reset the
    // connection and could destroy the 503 before the client reads it.
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream.expires_after(std::chrono::seconds(1));
    char sink[4096];
    for (int i = 0; i < 16; ++i) {
      auto [ec, n] = co_await stream.async_read_some(net::buffer(sink), nothrow);
      (void)n;
      if (ec) break;
    }
  }

  awaitable<void> session(tcp::socket socket) {
    service.telemetry().connection_opened();
    struct Closed {
      Telemetry& t;
      std::atomic<int>& n;
      ~Closed() {
        t.connection_closed();
        n.fetch_sub(1);
      }
    } closed{service.telemetry(), connections};
    boost::system::error_code local_ec;
    const auto local = socket.local_endpoint(local_ec);
    const std::string local_address = local_ec ? std::string() : local.address().to_string();
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    const auto timeout = std::chrono::milliseconds(int64_t(options.read_timeout_seconds * 1000));
    for (;;) {
      HttpRequestParser parser;
      limit_request_parser(parser, options.max_body_bytes);
      stream.expires_after(timeout);
      auto [ec, bytes] = co_await http::async_read(stream, buffer, parser, nothrow);
      (void)bytes;
      const auto t0 = Clock::now();
      if (ec) {
        // Refused while reading: the response says why, the connection closes (the rest of the request is unread).
        // Whatever of the request was parsed (a body over the limit is refused once its header fields are read).
        const Request& partial = parser.get();
        Exchange ex;
        ex.version = partial.version() == 10 ? 10 : 11;
        ex.request_id = request_id(header_value(partial, "x-request-id"));
        ex.route = route_label(std::string_view(partial.target().data(), partial.target().size()));
        if (ec == http::error::body_limit) {
          co_await send_error(stream, ex,
                              ApiError(413, fmt::format("The request body exceeds the limit of {} bytes.",
                                                        options.max_body_bytes),
                                       "invalid_request_error", {}, "request_too_large"),
                              "body_too_large");
        } else if (ec == http::error::header_limit) {
          co_await send_error(stream, ex, ApiError(431, "The request headers are too large.", "invalid_request_error",
                                                   {}, "headers_too_large"),
                              "headers_too_large");
        } else if (ec != http::error::end_of_stream && ec != http::error::partial_message &&
                   ec.category() == http::make_error_code(http::error::bad_target).category()) {
          co_await send_error(stream, ex, ApiError(400, fmt::format("Malformed HTTP request: {}.", ec.message()),
                                                   "invalid_request_error", {}, "malformed_request"),
                              "malformed_request");
        }
        if (ex.status) record(ex, t0);
        break;
      }
      stream.expires_never();
      Request request = parser.release();
      Exchange ex;
      ex.version = request.version();
      ex.keep_alive = request.keep_alive();
      ex.head = request.method() == http::verb::head;
      ex.request_id = request_id(header_value(request, "x-request-id"));
      bool keep = false;
      try {
        keep = co_await handle(stream, request, ex, local_address);
      } catch (const std::exception& e) {
        spdlog::error("[server] {} {} failed: {} (x-request-id {})", std::string(request.method_string()),
                      loggable_target(request.target()), e.what(), ex.request_id);
        keep = false;
      }
      record(ex, t0);
      if (!keep) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  // Writes a whole response (Content-Length; for HEAD the headers only). True when the connection stays open.
  awaitable<bool> send(beast::tcp_stream& stream, Exchange& ex, int status, std::string_view content_type,
                       std::string body) {
    ex.status = status;
    http::response<http::string_body> res{http::status(status), ex.version};
    common_headers(res, ex);
    if (!content_type.empty()) res.set(http::field::content_type, content_type);
    res.keep_alive(ex.keep_alive);
    res.body() = std::move(body);
    res.prepare_payload();
    stream.expires_after(kWriteTimeout);
    boost::system::error_code ec;
    if (ex.head) {
      http::response_serializer<http::string_body> serializer{res};
      std::tie(ec, std::ignore) = co_await http::async_write_header(stream, serializer, nothrow);
    } else {
      std::tie(ec, std::ignore) = co_await http::async_write(stream, res, nothrow);
    }
    stream.expires_never();
    co_return !ec && ex.keep_alive;
  }

  awaitable<bool> send_error(beast::tcp_stream& stream, Exchange& ex, const ApiError& e, std::string refusal = {}) {
    ex.refusal = std::move(refusal);
    if (e.status() >= 500)
      spdlog::warn("[server] {} {}: {} (x-request-id {})", e.status(), ex.route, e.what(), ex.request_id);
    // Built before the co_await: GCC 12 destroys a ?: temporary inside a co_await expression twice.
    std::string body = ex.anthropic ? anthropic_error_body(e) : e.body();
    co_return co_await send(stream, ex, e.status(), "application/json", std::move(body));
  }

  // Peeks a readable socket: true when the client has closed it (EOF or reset); false when it sent more data
  // (a pipelined request, left in the socket for later).
  static bool client_gone(tcp::socket& socket) {
    char byte;
    const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

  // Waits for the engine's wakeup, or for the client to go away (returns false then).
  awaitable<bool> wait_engine(beast::tcp_stream& stream, net::steady_timer& timer, bool& watch_socket) {
    if (!watch_socket) {
      co_await timer.async_wait(nothrow);
      co_return true;
    }
    auto result = co_await (timer.async_wait(nothrow) ||
                            stream.socket().async_wait(tcp::socket::wait_read, nothrow));
    if (result.index() == 1) {
      auto [ec] = std::get<1>(result);
      if (ec || client_gone(stream.socket())) co_return false;
      watch_socket = false;  // pipelined bytes: stop watching, they belong to the next request
    }
    co_return true;
  }

  awaitable<bool> handle(beast::tcp_stream& stream, Request& req, Exchange& ex, const std::string& local_address) {
    const Verdict verdict = check_request(policy, request_facts(req, local_address));
    ex.route = verdict.route;
    ex.anthropic = verdict.route.starts_with("/v1/messages");
    ex.cors_origin = verdict.cors_origin;
    ex.allow = verdict.allow;

    if (verdict.action == Action::refuse)
      co_return co_await send_error(stream, ex,
                                    ApiError(verdict.status, verdict.message, "invalid_request_error", {}, verdict.code),
                                    verdict.reason);
    if (verdict.action == Action::preflight) {
      ex.status = 204;
      http::response<http::empty_body> res{http::status::no_content, ex.version};
      common_headers(res, ex);
      res.set(http::field::allow, ex.allow);
      if (!ex.cors_origin.empty()) {
        res.set(http::field::access_control_allow_methods, ex.allow);
        res.set(http::field::access_control_allow_headers,
                "Authorization, Content-Type, X-Request-Id, X-Api-Key, Anthropic-Version, Anthropic-Beta");
        res.set(http::field::access_control_max_age, "600");
      }
      res.keep_alive(ex.keep_alive);
      res.content_length(0);
      stream.expires_after(kWriteTimeout);
      auto [ec, n] = co_await http::async_write(stream, res, nothrow);
      (void)n;
      stream.expires_never();
      co_return !ec && ex.keep_alive;
    }

    const std::string& path = ex.route;
    if (path == "/") co_return co_await send(stream, ex, 200, "text/html; charset=utf-8", std::string(dashboard_html()));
    if (path == "/health/live") co_return co_await send(stream, ex, 200, "application/json", R"({"status":"ok"})");
    if (path == "/health")
      co_return co_await send(stream, ex, 200, "application/json",
                              boost::json::serialize(service.telemetry().health()));
    if (path == "/metrics")
      co_return co_await send(stream, ex, 200, "text/plain; version=0.0.4; charset=utf-8",
                              service.telemetry().metrics());
    if (path == "/v1/models") co_return co_await send(stream, ex, 200, "application/json", service.models_json());
    if (path == "/wisdom") {
      std::string body;
      std::optional<ApiError> failure;
      try {
        body = service.wisdom_json();
      } catch (const ApiError& e) {
        failure = e;
      }
      if (failure) co_return co_await send_error(stream, ex, *failure);
      co_return co_await send(stream, ex, 200, "application/json", std::move(body));
    }
    if (path == "/v1/telemetry") co_return co_await telemetry_stream(stream, req, ex);
    if (path == "/v1/models/{id}") {
      const std::string_view target(req.target().data(), req.target().size());
      const std::string_view p = target.substr(0, target.find('?'));
      std::string body;
      std::optional<ApiError> failure;
      try {
        body = service.model_json(percent_decode(p.substr(std::string_view("/v1/models/").size())));
      } catch (const ApiError& e) {
        failure = e;
      }
      if (failure) co_return co_await send_error(stream, ex, *failure, refusal_of(*failure));
      co_return co_await send(stream, ex, 200, "application/json", std::move(body));
    }
    if (path == "/v1/messages/count_tokens") {
      std::string body;
      std::optional<ApiError> failure;
      try {
        AnthropicRequest a = parse_anthropic_count_tokens(req.body());
        if (!a.request.model.empty() && a.request.model != service.model_id())
          throw ApiError(404, fmt::format("model: {}", a.request.model), "not_found_error", "model", "model_not_found");
        body = anthropic_count_tokens_body(service.count_prompt_tokens(a.request));
      } catch (const ApiError& e) {
        failure = e;
      } catch (const std::exception& e) {
        failure = ApiError(400, e.what());
      }
      if (failure) co_return co_await send_error(stream, ex, *failure, refusal_of(*failure));
      co_return co_await send(stream, ex, 200, "application/json", std::move(body));
    }
    co_return co_await completion(stream, req, ex,
                                  path == "/v1/chat/completions" ? Api::chat
                                  : path == "/v1/messages"       ? Api::anthropic
                                  : path == "/v1/responses"      ? Api::responses
                                                                 : Api::completion);
  }

  // Sends the header of a text/event-stream response: chunked for HTTP/1.1; for HTTP/1.0 (no chunked encoding) the
  // body runs to the end of the connection.
  awaitable<bool> start_sse(beast::tcp_stream& stream, Exchange& ex) {
    ex.status = 200;
    if (!ex.chunked()) ex.keep_alive = false;
    http::response<http::empty_body> res{http::status::ok, ex.version};
    common_headers(res, ex);
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.set("X-Accel-Buffering", "no");
    if (ex.chunked()) res.chunked(true);
    res.keep_alive(ex.keep_alive);
    http::response_serializer<http::empty_body> serializer{res};
    stream.expires_after(kWriteTimeout);
    auto [ec, n] = co_await http::async_write_header(stream, serializer, nothrow);
    (void)n;
    stream.expires_never();
    co_return !ec;
  }

  awaitable<bool> write_event(beast::tcp_stream& stream, const Exchange& ex, std::string_view data) {
    if (data.empty()) co_return true;  // an empty chunk would be the chunked body's terminator
    stream.expires_after(kWriteTimeout);
    boost::system::error_code ec;
    if (ex.chunked())
      std::tie(ec, std::ignore) = co_await net::async_write(stream, http::make_chunk(net::buffer(data)), nothrow);
    else
      std::tie(ec, std::ignore) = co_await net::async_write(stream, net::buffer(data), nothrow);
    stream.expires_never();
    co_return !ec;
  }

  // Ends an event stream; true when the connection stays open (HTTP/1.0: the close ends the body).
  awaitable<bool> end_events(beast::tcp_stream& stream, const Exchange& ex) {
    if (!ex.chunked()) co_return false;
    stream.expires_after(kWriteTimeout);
    auto [ec, n] = co_await net::async_write(stream, http::make_chunk_last(), nothrow);
    (void)n;
    stream.expires_never();
    co_return !ec && ex.keep_alive;
  }

  awaitable<bool> telemetry_stream(beast::tcp_stream& stream, Request& req, Exchange& ex) {
    int64_t limit = -1;  // ?limit=N ends the stream after N snapshots (for tests and scripts)
    if (auto l = query_param(std::string_view(req.target().data(), req.target().size()), "limit"); !l.empty()) {
      try {
        limit = std::stoll(l);
      } catch (...) {
        limit = -1;
      }
    }
    if (!co_await start_sse(stream, ex)) co_return false;
    if (ex.head) co_return ex.chunked() && ex.keep_alive;  // the headers a GET would get, and no body
    net::steady_timer timer(stream.get_executor());
    TelemetryCursor cursor;
    bool watch = true;
    for (int64_t sent = 0; limit < 0 || sent < limit; ++sent) {
      if (sent > 0) {
        timer.expires_after(std::chrono::seconds(1));
        if (!co_await wait_engine(stream, timer, watch)) co_return false;
        {
          std::lock_guard lock(live_mutex);
          if (stopped) co_return false;
        }
      }
      const std::string event = sse(boost::json::serialize(service.telemetry().snapshot(cursor)));
      if (!co_await write_event(stream, ex, event)) co_return false;
    }
    co_return co_await end_events(stream, ex);
  }

  ApiError timeout_error() const {
    return ApiError(503, fmt::format("The request reached its deadline ({} s, --request-timeout) before generating "
                                     "anything: the server is busy. Retry later.", options.request_timeout_seconds),
                    "server_overloaded", {}, "request_timeout");
  }

  // One choice's progress through the loop below.
  struct ChoiceRun {
    std::optional<AssistantOutputParser> parser;  // chat: splits reasoning, content and tool calls
    ResponseFormat::Choice result;
    int calls_sent = 0;
    bool done = false;
    std::string stop_sequence;
    Usage usage;
  };

  // Splits a piece of a choice's text; parallel_tool_calls false keeps only the first call.
  static AssistantDelta split(ChoiceRun& run, const StartedCompletion& started, const std::string& text, bool last) {
    AssistantDelta d;
    if (run.parser) {
      if (!text.empty()) d = run.parser->push(text);
      if (last) d.append(run.parser->finish());
    } else {
      d.content = text;
    }
    if (started.single_tool_call) {
      const int room = std::max(0, 1 - run.calls_sent - int(run.result.output.tool_calls.size()));
      if (int(d.tool_calls.size()) > room) d.tool_calls.resize(size_t(room));
    }
    return d;
  }

  static std::string finish_reason_of(const ChoiceRun& run, const std::string& engine_reason) {
    if (engine_reason == "stop" && (run.calls_sent > 0 || !run.result.output.tool_calls.empty())) return "tool_calls";
    return engine_reason;
  }

  // kind: which API's body and response shape (chat/completions, completions, Anthropic messages, responses).
  enum class Api { chat, completion, anthropic, responses };

  awaitable<bool> completion(beast::tcp_stream& stream, Request& req, Exchange& ex, Api api) {
    auto wakeup = std::make_shared<Wakeup>();
    wakeup->timer = std::make_shared<net::steady_timer>(stream.get_executor(), Clock::time_point::max());
    Tie tie(*this, wakeup);
    StartedCompletion started;
    std::unique_ptr<CompletionWriter> writer;
    std::optional<ApiError> failure;
    const auto deadline = options.request_timeout_seconds > 0
                              ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(options.request_timeout_seconds))
                              : Clock::time_point::max();
    try {
      auto notify = [wakeup] { wakeup->fire(); };
      if (api == Api::anthropic) {
        AnthropicRequest a = parse_anthropic_messages(req.body());
        started = service.start(std::move(a.request), notify, deadline);
        writer = make_anthropic_writer(service.model_id(), started.prompt_tokens);
      } else if (api == Api::responses) {
        ResponsesRequest r = parse_responses_request(req.body());
        started = service.start(std::move(r.request), notify, deadline);
        writer = make_responses_writer(service.model_id(), std::move(r.echo));
      } else {
        started = service.start_completion(req.body(), api == Api::chat ? Endpoint::chat : Endpoint::completion, notify,
                                           deadline);
        writer = make_openai_writer(started.format, started.include_usage);
      }
    } catch (const ApiError& e) {
      failure = e;
    } catch (const std::exception& e) {
      // Anything else escaping validation (e.g. a template or tokenizer error on this input) is the client's input.
      failure = ApiError(400, e.what());
    }
    if (failure) co_return co_await send_error(stream, ex, *failure, refusal_of(*failure));
    for (auto& c : started.choices) tie.add_handle(c.handle);
    service.telemetry().generation_started();
    struct Done {
      Telemetry& t;
      ~Done() { t.generation_finished(); }
    } done{service.telemetry()};
    net::steady_timer& timer = *wakeup->timer;
    // Watching the socket while queued or generating is what notices a client that hangs up: the sequences are then
    // cancelled (Tie) and give their queue places or slots back at once.
    bool watch = true;
    const size_t n = started.choices.size();
    std::vector<ChoiceRun> runs(n);
    for (size_t i = 0; i < n; ++i) {
      if (!started.parse_output) continue;
      AssistantOutputOptions o = started.output;
      if (n > 1) o.id_prefix += std::to_string(i) + "_";
      runs[i].parser.emplace(std::move(o));
    }
    Usage total;
    auto add_usage = [&](const Usage& u, size_t i) {
      if (i == 0) total.prompt_tokens = u.prompt_tokens, total.cached_tokens = u.cached_tokens;
      total.completion_tokens += u.completion_tokens;
    };
    // A failed choice fails the request: "error" / "timeout" / "cancelled" of any choice.
    std::string failed;
    std::string failure_detail;
    const bool streaming = started.streaming;
    if (streaming) {
      if (!co_await start_sse(stream, ex)) co_return false;
      if (!co_await write_event(stream, ex, writer->stream_start(int(n)))) co_return false;
    }
    for (;;) {
      timer.expires_at(Clock::time_point::max());
      std::string out;
      size_t finished = 0;
      for (size_t i = 0; i < n; ++i) {
        ChoiceRun& run = runs[i];
        if (run.done) {
          ++finished;
          continue;
        }
        CompletionPiece piece = started.choices[i].stream->take();
        AssistantDelta d = split(run, started, piece.text, piece.finished);
        if (piece.finished && failed.empty() &&
            (piece.finish_reason == "error" || piece.finish_reason == "timeout" || piece.finish_reason == "cancelled")) {
          failed = piece.finish_reason;
          failure_detail = piece.error;
        }
        if (streaming) {
          out += writer->stream_delta(int(i), d, piece.logprobs, run.calls_sent);
          run.calls_sent += int(d.tool_calls.size());
        } else {
          run.result.logprobs.insert(run.result.logprobs.end(), std::make_move_iterator(piece.logprobs.begin()),
                                     std::make_move_iterator(piece.logprobs.end()));
          run.result.output.append(std::move(d));
        }
        if (piece.finished) {
          run.done = true;
          ++finished;
          run.result.finish_reason = finish_reason_of(run, piece.finish_reason);
          run.stop_sequence = piece.stop_sequence;
          run.usage = piece.usage;
          add_usage(piece.usage, i);
          if (streaming && failed.empty())
            out += writer->stream_choice_end(int(i), run.result.finish_reason, run.stop_sequence, run.usage);
        }
      }
      if (!failed.empty() && finished < n) {
        for (auto& c : started.choices) c.handle->cancel();  // the others stop too; wait for their ends
      }
      if (finished == n && !failed.empty()) {
        if (failed == "cancelled") {
          ex.status = 499;  // client gone (or server stopping): nothing to send
          co_return false;
        }
        const ApiError e = failed == "timeout" ? timeout_error()
                                               : ApiError(500, "Generation failed: " + failure_detail, "server_error",
                                                          {}, "engine_error");
        std::string refusal = failed == "timeout" ? "timeout" : "";
        if (!streaming) co_return co_await send_error(stream, ex, e, std::move(refusal));
        ex.status = e.status();
        if (failed == "timeout") ex.refusal = "timeout";
        else spdlog::warn("[server] {}: generation failed: {} (x-request-id {})", ex.route, failure_detail, ex.request_id);
        if (!co_await write_event(stream, ex, out + writer->stream_error(e))) co_return false;
        co_return co_await end_events(stream, ex);
      }
      if (finished == n) {
        if (!streaming) {
          std::vector<ResponseFormat::Choice> choices;
          for (auto& r : runs) choices.push_back(std::move(r.result));
          co_return co_await send(stream, ex, 200, "application/json",
                                  writer->full(choices, runs[0].stop_sequence, total));
        }
        if (!co_await write_event(stream, ex, out + writer->stream_end(total))) co_return false;
        co_return co_await end_events(stream, ex);
      }
      if (streaming && !out.empty() && !co_await write_event(stream, ex, out)) co_return false;
      if (!co_await wait_engine(stream, timer, watch)) {
        ex.status = 499;
        co_return false;  // Tie's destructor cancels the sequences
      }
    }
  }
};

HttpServer::HttpServer(Service& service, const HttpServerOptions& options)
    : impl_(std::make_unique<Impl>(service, options)) {}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpServer::start() {
  net::co_spawn(impl_->ioc, impl_->accept_loop(), net::detached);
  for (int i = 0; i < std::max(1, impl_->options.io_threads); ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  spdlog::info("[server] listening on http://{}:{}", impl_->options.host, port());
  for (const auto& warning : startup_warnings(impl_->policy)) spdlog::warn("[server] {}", warning);
}

void HttpServer::stop() {
  if (!impl_) return;
  {
    std::lock_guard lock(impl_->live_mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
    for (auto& w : impl_->live_wakeups) w->close();
    for (auto& h : impl_->live_handles) h->cancel();
  }
  net::post(impl_->ioc, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace tierlm::server
