// server/http_server.h — HTTP/1.1 on Boost.Beast over Asio I/O threads (C++20 coroutines, one per connection):
// routing, bearer auth, body limits and timeouts, SSE for streamed completions and the telemetry stream.
// The engine runs on the scheduler's own thread; connections wait for its tokens without blocking an I/O thread.
// Owns: the io_context, acceptor and I/O threads. Never: runs model work on an I/O thread, or crashes on input.
// Beast is confined to http_server.cpp so the heavy headers compile once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tierlm::server {

class Service;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 5413;                   // 0: any free port (see port())
  int io_threads = 2;
  uint64_t max_body_bytes = 1 << 20;      // larger request bodies get 413
  std::string api_key;                    // empty: no auth
  double read_timeout_seconds = 30;       // to read one request (headers + body), and keep-alive idle time
};

class HttpServer {
 public:
  // Binds and listens (throws with the address on failure); serving starts with start().
  HttpServer(Service& service, const HttpServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  void start();
  // Stops accepting, cancels every generation still tied to a connection, and joins the I/O threads.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierlm::server
