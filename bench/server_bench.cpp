// Server throughput: requests/s and aggregate generated tok/s with 1, 4 and 16 concurrent streaming clients against
// the whole in-process server (scheduler + Beast on loopback), and the speed-up over a single stream. Each client
// sends streamed /v1/completions of 64 tokens (ignore_eos, so every request generates exactly that many) one after
// another. Model: tierlm-tiny, or TIERLM_BENCH_MODEL=DIR (a folder with tokenizer.json); weights converted to
// TIERLM_BENCH_WEIGHT_FORMAT (default: as stored). Compute threads: TIERLM_BENCH_THREADS (default 0: one per
// physical core).
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

TestServer& server() {
  static TestServer* s = [] {
    ServerOptions o;
    o.scheduler.max_batch = 16;
    o.scheduler.queue_limit = 256;
    o.scheduler.prefill_size = 256;
    o.scheduler.context = 512;
    o.scheduler.threads = std::getenv("TIERLM_BENCH_THREADS") ? std::atoi(std::getenv("TIERLM_BENCH_THREADS")) : 0;
    o.http.io_threads = 2;
    if (const char* m = std::getenv("TIERLM_BENCH_MODEL")) o.model_dir = m;
    if (const char* f = std::getenv("TIERLM_BENCH_WEIGHT_FORMAT")) o.weight_format = f;
    return new TestServer(o);
  }();
  return *s;
}

// One streamed completion; returns its completion_tokens from the usage chunk (0 on failure).
int64_t streamed_completion(uint16_t port, int client, int n) {
  const std::string body = R"({"prompt":"def handler_)" + std::to_string(client) + "_" + std::to_string(n) +
                           R"((request):","max_tokens":)" + std::to_string(kTokens) +
                           R"(,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}})";
  auto r = post(port, "/v1/completions", body);
  if (r.status != 200) return 0;
  const auto at = r.body.rfind("\"usage\":{");
  if (at == std::string::npos) return 0;
  const auto p = r.body.find("\"completion_tokens\":", at);
  return p == std::string::npos ? 0 : std::atoll(r.body.c_str() + p + 20);
}

double single_stream_tokens_per_second = 0;

void BM_ConcurrentStreams(benchmark::State& state) {
  const int clients = int(state.range(0));
  auto& s = server();
  int64_t tokens = 0, requests = 0, failures = 0;
  const auto stats0 = s.scheduler().stats();
  double seconds = 0;
  for (auto _ : state) {
    std::atomic<int64_t> got{0}, failed{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        for (int i = 0; i < kRequestsPerClient; ++i) {
          const int64_t n = streamed_completion(s.port(), c, i);
          n == kTokens ? got += n : ++failed;
        }
      });
    for (auto& t : threads) t.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
    tokens += got;
    failures += failed;
    requests += int64_t(clients) * kRequestsPerClient;
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
BENCHMARK(BM_ConcurrentStreams)->ArgName("streams")->Arg(1)->Arg(4)->Arg(16)->UseManualTime()->Iterations(2)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
