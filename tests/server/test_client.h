// tests/server/test_client.h — a blocking HTTP/1.1 client over POSIX sockets for the server tests (loopback only),
// and a fixture that runs the whole server (scheduler + Beast) in-process on a free port with the tierlm-tiny model.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>

#include "runtime/engine/scheduler.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/chat_prompt.h"
#include "server/expert_tier_counters.h"
#include "server/http_server.h"
#include "server/service.h"
#include "server/telemetry.h"

namespace tierlm::server::testing {

inline std::string tiny_model_dir() { return std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny"; }
inline std::string chatml_template() { return std::string(TIERLM_SOURCE_DIR) + "/tests/server/fixtures/chatml.jinja"; }

struct HttpResponse {
  int status = 0;
  std::string headers;
  std::string body;  // de-chunked
  boost::json::value json() const { return boost::json::parse(body); }
};

inline int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("connect failed");
  }
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// recv/send that retry when interrupted. A blocking socket call with SO_RCVTIMEO fails with EINTR (it is never
// restarted) whenever its thread is interrupted, and not only by a signal: under ASan the test thread's recv failed
// with EINTR and no signal delivered (strace, gdb) while another thread drove the io_uring ring this thread had set
// up (the MoE default model's expert reader, made by the TestServer constructor), after a second server had closed
// its ring. Whatever the kernel's reason, EINTR is "try again".
inline ssize_t recv_some(int fd, char* buf, size_t size) {
  for (;;) {
    const ssize_t n = ::recv(fd, buf, size, 0);
    if (n >= 0 || errno != EINTR) return n;
  }
}

inline void send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the server may close early (e.g. 413); the response is still read
    off += size_t(n);
  }
}

inline std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = recv_some(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

inline std::string dechunk(const std::string& body) {
  std::string out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t len = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    out += body.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

inline HttpResponse parse_response(const std::string& raw) {
  HttpResponse r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  r.headers = raw.substr(0, end);
  r.status = std::stoi(raw.substr(9, 3));
  r.body = raw.substr(end + 4);
  std::string lower = r.headers;
  for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("transfer-encoding: chunked") != std::string::npos) r.body = dechunk(r.body);
  return r;
}

// data: payloads of an SSE body, in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  return out;
}

// One request on a fresh connection ("Connection: close").
inline HttpResponse request(uint16_t port, const std::string& method, const std::string& target,
                            const std::string& body = {}, const std::string& extra_headers = {}) {
  const int fd = connect_loopback(port);
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  send_all(fd, req);
  const std::string raw = read_all(fd);
  ::close(fd);
  return parse_response(raw);
}

inline HttpResponse post(uint16_t port, const std::string& target, const std::string& body,
                         const std::string& extra_headers = {}) {
  return request(port, "POST", target, body, extra_headers);
}

// The in-process server: model, scheduler, service and Beast server.
struct ServerOptions {
  engine::SchedulerOptions scheduler;
  HttpServerOptions http;
  bool chat_template = true;
  std::string chat_template_file;  // "" : tests/server/fixtures/chatml.jinja
  std::string weight_format;  // "" : as stored
  std::string model_dir = tiny_model_dir();  // tokenizer (and, unless synthetic_layers > 0, weights)
  // > 0: serve a random-weight model of Llama-3.2-1B's shape with this many layers (weight_format, default q8_0)
  // instead of the folder's weights, for benchmarks that need weights larger than the CPU caches. Its vocabulary is
  // larger than the tokenizer's: ids the tokenizer lacks decode to nothing, so only token counts are meaningful.
  int64_t synthetic_layers = 0;
  // The expert tier (MoE models): a packed expert file to read instead of the folder's, its cache slots (0: the
  // loader's default), and its counters in /health and /metrics (refreshed after every step, as `serve` does).
  std::optional<std::filesystem::path> packed_experts;
  int64_t expert_slots = 0;
  bool expert_tier_counters = false;
  ServerOptions() {
    scheduler.threads = 1;
    scheduler.pin_threads = false;
    scheduler.context = 512;
    scheduler.max_batch = 4;
    scheduler.prefill_size = 64;
    http.port = 0;
    http.io_threads = 2;
  }
};

class TestServer {
 public:
  explicit TestServer(const ServerOptions& o = {}) : ledger_() {
    tokenizer_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::load(o.model_dir));
    model::LoadOptions load;
    load.ledger = &ledger_;
    if (!o.weight_format.empty()) load.weight_format = kernels::parse_format(o.weight_format);
    load.packed_experts = o.packed_experts;
    if (o.expert_slots > 0) load.experts.cache.slots = o.expert_slots;
    if (o.synthetic_layers > 0) {
      model::ModelConfig config = model::llama_1b_config();
      config.num_layers = o.synthetic_layers;
      config.max_position_embeddings = std::max<int64_t>(config.max_position_embeddings, o.scheduler.context);
      weights_ = std::make_unique<model::ModelWeights>(model::synthetic_model(
          config, kernels::parse_format(o.weight_format.empty() ? "q8_0" : o.weight_format), ledger_));
    } else {
      weights_ = std::make_unique<model::ModelWeights>(model::load_model(o.model_dir, load));
    }
    engine::SchedulerOptions scheduler = o.scheduler;
    std::shared_ptr<ExpertTierCounters> tier_counters;
    if (o.expert_tier_counters && weights_->experts) {
      tier_counters = std::make_shared<ExpertTierCounters>(weights_->experts);
      scheduler.after_step = [tier_counters] { tier_counters->refresh(); };
    }
    scheduler_ = std::make_unique<engine::Scheduler>(*weights_, ledger_, scheduler);
    ServerInfo info;
    info.model_id = "tierlm-tiny";
    info.model_path = o.model_dir;
    info.architecture = weights_->config.model_type;
    info.weight_bytes = weights_->bytes();
    // tierlm-tiny has ChatML special tokens but no chat_template: the tests supply one.
    auto prompt = ChatPrompt::load(o.model_dir,
                                   o.chat_template ? std::optional<std::string>(o.chat_template_file.empty() ? chatml_template()
                                                                                                : o.chat_template_file)
                                                   : std::nullopt,
                                   *tokenizer_);
    info.chat_template = prompt.description();
    telemetry_ = std::make_unique<Telemetry>(info, ledger_, *scheduler_);
    if (tier_counters) telemetry_->set_tiering(tier_counters);
    service_ = std::make_unique<Service>("tierlm-tiny", *tokenizer_, std::move(prompt), *scheduler_, *telemetry_);
    http_ = std::make_unique<HttpServer>(*service_, o.http);
    http_->start();
  }
  ~TestServer() {
    http_->stop();
    scheduler_->stop();
  }
  uint16_t port() const { return http_->port(); }
  engine::Scheduler& scheduler() { return *scheduler_; }
  Telemetry& telemetry() { return *telemetry_; }
  const tok::Tokenizer& tokenizer() const { return *tokenizer_; }
  tiering::Ledger& ledger() { return ledger_; }

 private:
  tiering::Ledger ledger_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  std::unique_ptr<model::ModelWeights> weights_;
  std::unique_ptr<engine::Scheduler> scheduler_;
  std::unique_ptr<Telemetry> telemetry_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace tierlm::server::testing
