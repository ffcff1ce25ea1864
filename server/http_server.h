// server/http_server.h — HTTP/1.1 (and 1.0) on Boost.Beast over Asio I/O threads (C++20 coroutines, one per
// connection): applies server/request_policy.h (Host allow-list, Origin and content type, CORS, bearer auth, routes),
// body and header limits, read timeouts, a connection cap, accept back-off when out of file descriptors, request
// deadlines, x-request-id, SSE for streamed completions and the telemetry stream.
// The engine runs on the scheduler's own thread; connections wait for its tokens without blocking an I/O thread.
// Owns: the io_context, acceptor and I/O threads. Never: runs model work on an I/O thread, crashes on input, or
// busy-loops on a failing accept().
// Beast is confined to http_server.cpp so the heavy headers compile once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tierlm::server {

class Service;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 5413;                   // 0: any free port (see port())
  int io_threads = 2;
  uint64_t max_body_bytes = 1 << 20;      // larger request bodies get 413
  std::string api_key;                    // empty: no auth (every route but /health/live and / needs it otherwise)
  double read_timeout_seconds = 30;       // to read one request (headers + body), and keep-alive idle time
  // Host header names answered besides the loopback names and addresses and the server's own address; "*": any
  // (no DNS-rebinding protection). Entries may be comma-separated lists.
  std::vector<std::string> allowed_hosts;
  // Origins allowed to call the API from a browser (CORS: preflight answered, Access-Control-Allow-Origin set);
  // none: CORS off, and a POST with another site's Origin gets 403.
  std::vector<std::string> cors_origins;
  int max_connections = 512;              // open connections; beyond it a new one is answered 503 and closed
  double request_timeout_seconds = 600;   // a generation's deadline, from its request (0: none)
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
