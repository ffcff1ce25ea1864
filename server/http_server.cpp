#include "server/http_server.h"

#include <sys/socket.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <variant>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/dashboard.h"
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
using Request = http::request<http::string_body>;

namespace {

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

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string query_param(std::string_view target, std::string_view key) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) == key && eq != std::string_view::npos) {
      std::string out;
      std::string_view v = pair.substr(eq + 1);
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '%' && i + 2 < v.size() && hex(v[i + 1]) >= 0 && hex(v[i + 2]) >= 0) {
          out += char(hex(v[i + 1]) * 16 + hex(v[i + 2]));
          i += 2;
        } else {
          out += v[i] == '+' ? ' ' : v[i];
        }
      }
      return out;
    }
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return {};
}

std::string sse(std::string_view data) { return fmt::format("data: {}\n\n", data); }

}  // namespace

struct HttpServer::Impl {
  Service& service;
  HttpServerOptions options;
  // Declared before the io_context: connection frames destroyed with it still unregister here.
  std::mutex live_mutex;
  std::set<std::shared_ptr<Wakeup>> live_wakeups;
  std::set<std::shared_ptr<engine::SequenceHandle>> live_handles;
  bool stopped = false;
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;

  Impl(Service& s, const HttpServerOptions& o) : service(s), options(o), ioc(std::max(1, o.io_threads)), acceptor(ioc) {
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
    std::shared_ptr<engine::SequenceHandle> handle;
    Tie(Impl& i, std::shared_ptr<Wakeup> w) : impl(i), wakeup(std::move(w)) {
      std::lock_guard lock(impl.live_mutex);
      impl.live_wakeups.insert(wakeup);
    }
    void set_handle(std::shared_ptr<engine::SequenceHandle> h) {
      handle = std::move(h);
      std::lock_guard lock(impl.live_mutex);
      impl.live_handles.insert(handle);
    }
    ~Tie() {
      wakeup->close();
      if (handle) handle->cancel();  // no effect once the sequence has finished
      std::lock_guard lock(impl.live_mutex);
      impl.live_wakeups.erase(wakeup);
      if (handle) impl.live_handles.erase(handle);
    }
  };

  awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(net::make_strand(ioc), nothrow);
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
        spdlog::warn("[server] accept failed: {}", ec.message());
        continue;
      }
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

  awaitable<void> session(tcp::socket socket) {
    service.telemetry().connection_opened();
    struct Closed {
      Telemetry& t;
      ~Closed() { t.connection_closed(); }
    } closed{service.telemetry()};
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    const auto timeout = std::chrono::milliseconds(int64_t(options.read_timeout_seconds * 1000));
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(options.max_body_bytes);
      parser.header_limit(16 * 1024);
      stream.expires_after(timeout);
      auto [ec, bytes] = co_await http::async_read(stream, buffer, parser, nothrow);
      (void)bytes;
      if (ec) {
        if (ec == http::error::body_limit) {
          co_await send_error(stream, 11, ApiError(413, fmt::format("The request body exceeds the limit of {} bytes.",
                                                                    options.max_body_bytes),
                                                   "invalid_request_error", {}, "request_too_large"), false);
        } else if (ec == http::error::header_limit) {
          co_await send_error(stream, 11, ApiError(431, "The request headers are too large."), false);
        } else if (ec != http::error::end_of_stream && ec != http::error::partial_message &&
                   ec.category() == http::make_error_code(http::error::bad_target).category()) {
          co_await send_error(stream, 11, ApiError(400, fmt::format("Malformed HTTP request: {}.", ec.message())), false);
        }
        break;
      }
      stream.expires_never();
      Request request = parser.release();
      const auto t0 = Clock::now();
      std::string route;
      int status = 0;
      bool keep = false;
      try {
        keep = co_await handle(stream, request, route, status);
      } catch (const std::exception& e) {
        spdlog::error("[server] {} {} failed: {}", std::string(request.method_string()), std::string(request.target()), e.what());
        keep = false;
      }
      service.telemetry().record_request(route, status, std::chrono::duration<double>(Clock::now() - t0).count());
      if (!keep) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  awaitable<bool> send(beast::tcp_stream& stream, unsigned version, bool keep_alive, http::status status,
                       std::string_view content_type, std::string body) {
    http::response<http::string_body> res{status, version};
    res.set(http::field::server, "tierlm");
    res.set(http::field::content_type, content_type);
    res.keep_alive(keep_alive);
    res.body() = std::move(body);
    res.prepare_payload();
    stream.expires_after(std::chrono::seconds(60));
    auto [ec, n] = co_await http::async_write(stream, res, nothrow);
    (void)n;
    stream.expires_never();
    co_return !ec && keep_alive;
  }

  awaitable<bool> send_error(beast::tcp_stream& stream, unsigned version, const ApiError& e, bool keep_alive,
                             int* status_out = nullptr) {
    if (status_out) *status_out = e.status();
    co_return co_await send(stream, version, keep_alive, http::status(e.status()), "application/json", e.body());
  }

  bool authorized(const Request& req, bool allow_query) const {
    if (options.api_key.empty()) return true;
    const auto header = req[http::field::authorization];
    constexpr std::string_view bearer = "Bearer ";
    if (header.size() > bearer.size() && header.substr(0, bearer.size()) == bearer &&
        constant_time_equal(header.substr(bearer.size()), options.api_key))
      return true;
    return allow_query && constant_time_equal(query_param(req.target(), "api_key"), options.api_key);
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

  awaitable<bool> handle(beast::tcp_stream& stream, Request& req, std::string& route, int& status) {
    const unsigned version = req.version();
    const bool keep_alive = req.keep_alive();
    std::string_view target = req.target();
    const std::string path(target.substr(0, target.find('?')));
    const bool is_get = req.method() == http::verb::get, is_post = req.method() == http::verb::post;
    auto reply = [&](int code, std::string_view type, std::string body) -> awaitable<bool> {
      status = code;
      co_return co_await send(stream, version, keep_alive, http::status(code), type, std::move(body));
    };
    auto error = [&](const ApiError& e) -> awaitable<bool> {
      co_return co_await send_error(stream, version, e, keep_alive, &status);
    };
    static const std::set<std::string> post_routes = {"/v1/chat/completions", "/v1/completions"};
    static const std::set<std::string> get_routes = {"/", "/health", "/metrics", "/v1/models", "/v1/telemetry",
                                                     "/wisdom"};
    route = post_routes.count(path) || get_routes.count(path) ? path : "other";
    if (route == "other")
      co_return co_await error(ApiError(404, fmt::format("Unknown route: {} {}", std::string(req.method_string()), path),
                                        "invalid_request_error", {}, "unknown_url"));
    if ((post_routes.count(path) && !is_post) || (get_routes.count(path) && !is_get))
      co_return co_await error(ApiError(405, fmt::format("Method {} is not allowed on {}.",
                                                         std::string(req.method_string()), path),
                                        "invalid_request_error", {}, "method_not_allowed"));
    const bool open_route = path == "/" || path == "/health";
    if (!open_route && !authorized(req, path == "/v1/telemetry"))
      co_return co_await error(ApiError(401, "Incorrect API key provided.", "invalid_request_error", {},
                                        "invalid_api_key"));

    if (path == "/") co_return co_await reply(200, "text/html; charset=utf-8", std::string(dashboard_html()));
    if (path == "/health")
      co_return co_await reply(200, "application/json", boost::json::serialize(service.telemetry().health()));
    if (path == "/metrics")
      co_return co_await reply(200, "text/plain; version=0.0.4; charset=utf-8", service.telemetry().metrics());
    if (path == "/v1/models") co_return co_await reply(200, "application/json", service.models_json());
    if (path == "/wisdom") {
      std::string body;
      std::optional<ApiError> failure;
      try {
        body = service.wisdom_json();
      } catch (const ApiError& e) {
        failure = e;
      }
      if (failure) co_return co_await error(*failure);
      co_return co_await reply(200, "application/json", std::move(body));
    }
    if (path == "/v1/telemetry") {
      status = 200;
      co_return co_await telemetry_stream(stream, req);
    }
    co_return co_await completion(stream, req, path == "/v1/chat/completions" ? Endpoint::chat : Endpoint::completion,
                                  status);
  }

  // Sends the header of a chunked text/event-stream response.
  awaitable<bool> start_sse(beast::tcp_stream& stream, unsigned version) {
    http::response<http::empty_body> res{http::status::ok, version};
    res.set(http::field::server, "tierlm");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.set("X-Accel-Buffering", "no");
    res.chunked(true);
    res.keep_alive(true);
    http::response_serializer<http::empty_body> serializer{res};
    auto [ec, n] = co_await http::async_write_header(stream, serializer, nothrow);
    (void)n;
    co_return !ec;
  }

  awaitable<bool> write_chunk(beast::tcp_stream& stream, std::string_view data) {
    stream.expires_after(std::chrono::seconds(60));  // a client that stops reading does not hold us forever
    auto [ec, n] = co_await net::async_write(stream, http::make_chunk(net::buffer(data)), nothrow);
    (void)n;
    stream.expires_never();
    co_return !ec;
  }

  awaitable<bool> end_chunks(beast::tcp_stream& stream) {
    auto [ec, n] = co_await net::async_write(stream, http::make_chunk_last(), nothrow);
    (void)n;
    co_return !ec;
  }

  awaitable<bool> telemetry_stream(beast::tcp_stream& stream, Request& req) {
    int64_t limit = -1;  // ?limit=N ends the stream after N snapshots (for tests and scripts)
    if (auto l = query_param(req.target(), "limit"); !l.empty()) {
      try {
        limit = std::stoll(l);
      } catch (...) {
        limit = -1;
      }
    }
    const bool keep_alive = req.keep_alive();
    if (!co_await start_sse(stream, req.version())) co_return false;
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
      if (!co_await write_chunk(stream, event)) co_return false;
    }
    co_return co_await end_chunks(stream) && keep_alive;
  }

  awaitable<bool> completion(beast::tcp_stream& stream, Request& req, Endpoint endpoint, int& status) {
    const unsigned version = req.version();
    const bool keep_alive = req.keep_alive();
    auto wakeup = std::make_shared<Wakeup>();
    wakeup->timer = std::make_shared<net::steady_timer>(stream.get_executor(), Clock::time_point::max());
    Tie tie(*this, wakeup);
    StartedCompletion started;
    std::optional<ApiError> failure;
    try {
      started = service.start_completion(req.body(), endpoint, [wakeup] { wakeup->fire(); });
    } catch (const ApiError& e) {
      failure = e;
    } catch (const std::exception& e) {
      // Anything else escaping validation (e.g. a template or tokenizer error on this input) is the client's input.
      failure = ApiError(400, e.what());
    }
    if (failure) co_return co_await send_error(stream, version, *failure, keep_alive, &status);
    tie.set_handle(started.handle);
    service.telemetry().generation_started();
    struct Done {
      Telemetry& t;
      ~Done() { t.generation_finished(); }
    } done{service.telemetry()};
    net::steady_timer& timer = *wakeup->timer;
    bool watch = true;
    const ResponseFormat& format = started.format;

    if (!started.streaming) {
      std::string text;
      std::vector<LogprobEntry> logprobs;
      for (;;) {
        timer.expires_at(Clock::time_point::max());
        CompletionPiece piece = started.stream->take();
        text += piece.text;
        logprobs.insert(logprobs.end(), std::make_move_iterator(piece.logprobs.begin()),
                        std::make_move_iterator(piece.logprobs.end()));
        if (piece.finished) {
          if (piece.finish_reason == "error")
            co_return co_await send_error(stream, version, ApiError(500, "Generation failed: " + piece.error,
                                                                    "server_error", {}, "engine_error"),
                                          keep_alive, &status);
          if (piece.finish_reason == "cancelled") {
            status = 499;  // client gone (or server stopping): nothing to send
            co_return false;
          }
          status = 200;
          co_return co_await send(stream, version, keep_alive, http::status::ok, "application/json",
                                  format.full(text, logprobs, piece.finish_reason, piece.usage));
        }
        if (!co_await wait_engine(stream, timer, watch)) {
          status = 499;
          co_return false;  // Tie's destructor cancels the sequence
        }
      }
    }

    status = 200;
    if (!co_await start_sse(stream, version)) co_return false;
    const bool usage_null = started.include_usage;
    if (endpoint == Endpoint::chat && !co_await write_chunk(stream, sse(format.chunk("", {}, "", true, usage_null))))
      co_return false;
    for (;;) {
      timer.expires_at(Clock::time_point::max());
      CompletionPiece piece = started.stream->take();
      if (!piece.text.empty() || !piece.logprobs.empty())
        if (!co_await write_chunk(stream, sse(format.chunk(piece.text, piece.logprobs, "", false, usage_null))))
          co_return false;
      if (piece.finished) {
        if (piece.finish_reason == "cancelled") co_return false;
        std::string tail;
        if (piece.finish_reason == "error") {
          status = 500;
          tail += sse(error_body("Generation failed: " + piece.error, "server_error", {}, "engine_error"));
        } else {
          tail += sse(format.chunk("", {}, piece.finish_reason, false, usage_null));
          if (started.include_usage) tail += sse(format.usage_chunk(piece.usage));
        }
        tail += "data: [DONE]\n\n";
        if (!co_await write_chunk(stream, tail)) co_return false;
        co_return co_await end_chunks(stream) && keep_alive;
      }
      if (!co_await wait_engine(stream, timer, watch)) co_return false;
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
