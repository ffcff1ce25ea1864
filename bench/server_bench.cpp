// Server throughput: requests/s and aggregate generated tok/s with 1, 4 and 16 concurrent streaming clients against
// the whole in-process server (scheduler + Beast on loopback), and the speed-up over a single stream. Each client
// sends streamed /v1/completions of 64 tokens (ignore_eos, so every request generates exactly that many) one after
// another. Model: tierlm-tiny, or TIERLM_BENCH_MODEL=DIR (a folder with tokenizer.json); weights converted to
// TIERLM_BENCH_WEIGHT_FORMAT (default: as stored). Compute threads: TIERLM_BENCH_THREADS (default 0: one per
// physical core). BM_ConcurrentStreamsMemoryBound serves a random-weight model of Llama-3.2-1B's shape cut to
// TIERLM_BENCH_SYNTHETIC_LAYERS layers (default 2; q8_0, about 0.5 GB) with tierlm-tiny's tokenizer: its weights do
// not fit in the CPU caches, so decode is bound by memory bandwidth, as with real models, and batching shows.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "tests/server/test_client.h"

namespace {

using namespace tierlm::server::testing;
namespace json = boost::json;

constexpr int kTokens = 64;
constexpr int kRequestsPerClient = 4;

ServerOptions base_options() {
  ServerOptions o;
  o.scheduler.max_batch = 16;
  o.scheduler.queue_limit = 256;
  o.scheduler.prefill_size = 256;
  o.scheduler.context = 512;
  o.scheduler.threads = std::getenv("TIERLM_BENCH_THREADS") ? std::atoi(std::getenv("TIERLM_BENCH_THREADS")) : 0;
  o.http.io_threads = 2;
  return o;
}

TestServer& synthetic_server() {
  static TestServer* s = [] {
    ServerOptions o = base_options();
    o.synthetic_layers = std::getenv("TIERLM_BENCH_SYNTHETIC_LAYERS") ? std::atoi(std::getenv("TIERLM_BENCH_SYNTHETIC_LAYERS")) : 2;
    return new TestServer(o);
  }();
  return *s;
}

TestServer& server() {
  static TestServer* s = [] {
    ServerOptions o = base_options();
    if (const char* m = std::getenv("TIERLM_BENCH_MODEL")) o.model_dir = m;
    if (const char* f = std::getenv("TIERLM_BENCH_WEIGHT_FORMAT")) o.weight_format = f;
    return new TestServer(o);
  }();
  return *s;
}

// Sampling temperature of every request: TIERLM_BENCH_TEMPERATURE (default 1, OpenAI's default; 0 is greedy and
// skips the sampler's sort of the vocabulary).
std::string temperature() {
  const char* t = std::getenv("TIERLM_BENCH_TEMPERATURE");
  return t ? t : "1";
}

// One streamed completion; returns its completion_tokens from the usage chunk (0 on failure).
int64_t streamed_completion(uint16_t port, int client, int n, int tokens) {
  const std::string body = R"({"prompt":"def handler_)" + std::to_string(client) + "_" + std::to_string(n) +
                           R"((request):","max_tokens":)" + std::to_string(tokens) + R"(,"temperature":)" +
                           temperature() + R"(,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}})";
  auto r = post(port, "/v1/completions", body);
  if (r.status != 200) return 0;
  const auto at = r.body.rfind("\"usage\":{");
  if (at == std::string::npos) return 0;
  const auto p = r.body.find("\"completion_tokens\":", at);
  return p == std::string::npos ? 0 : std::atoll(r.body.c_str() + p + 20);
}

void run_streams(benchmark::State& state, TestServer& s, int tokens_per_request, int requests_per_client,
                 double& single_stream_tokens_per_second) {
  const int clients = int(state.range(0));
  int64_t tokens = 0, requests = 0, failures = 0;
  const auto stats0 = s.scheduler().stats();
  double seconds = 0;
  for (auto _ : state) {
    std::atomic<int64_t> got{0}, failed{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        for (int i = 0; i < requests_per_client; ++i) {
          const int64_t n = streamed_completion(s.port(), c, i, tokens_per_request);
          n == tokens_per_request ? got += n : ++failed;
        }
      });
    for (auto& t : threads) t.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
    tokens += got;
    failures += failed;
    requests += int64_t(clients) * requests_per_client;
  }
  const auto stats1 = s.scheduler().stats();
  const double tps = double(tokens) / seconds;
  if (clients == 1) single_stream_tokens_per_second = tps;
  state.counters["requests_per_s"] = double(requests) / seconds;
  state.counters["tok_per_s"] = tps;
  state.counters["per_stream_tok_per_s"] = tps / clients;
  state.counters["speedup_vs_1"] = single_stream_tokens_per_second > 0 ? tps / single_stream_tokens_per_second : 0;
  state.counters["mean_batch"] = double(stats1.batched_rows_total - stats0.batched_rows_total) /
                                 double(std::max<uint64_t>(1, stats1.steps_total - stats0.steps_total));
  state.counters["failed"] = double(failures);
}
double tiny_single = 0, synthetic_single = 0;

void BM_ConcurrentStreams(benchmark::State& state) { run_streams(state, server(), kTokens, kRequestsPerClient, tiny_single); }
void BM_ConcurrentStreamsMemoryBound(benchmark::State& state) {
  run_streams(state, synthetic_server(), 16, 1, synthetic_single);
}
BENCHMARK(BM_ConcurrentStreams)->ArgName("streams")->Arg(1)->Arg(4)->Arg(16)->UseManualTime()->Iterations(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConcurrentStreamsMemoryBound)->ArgName("streams")->Arg(1)->Arg(4)->Arg(16)->UseManualTime()
    ->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
