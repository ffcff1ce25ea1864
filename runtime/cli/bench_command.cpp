// `tierlm bench` — decode and prefill speed of a synthetic 1B-class llama per weight format, against the RAM
// bandwidth roofline measured in the same run (bytes of weights read per token / measured read bandwidth).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/cli/commands.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/generator.h"
#include "runtime/kernels/bandwidth.h"
#include "runtime/model/synthetic.h"

namespace tierlm::cli {

namespace {

struct BenchOptions {
  std::vector<std::string> formats = {"f16", "q8_0", "q4"};
  int threads = 0;
  int64_t decode_tokens = 32;
  int64_t prefill_tokens = 128;
  int64_t layers = 0;  // 0: the 1B shape's 16
};

// Bytes one decode step must read: every layer matrix once, plus the output head (the tied embedding).
uint64_t bytes_per_token(const model::ModelWeights& m) {
  uint64_t b = kernels::weight_bytes(m.output());
  for (auto& l : m.layers)
    b += kernels::weight_bytes(l.qkv.view) + kernels::weight_bytes(l.o.view) + kernels::weight_bytes(l.gate_up.view) +
         kernels::weight_bytes(l.down.view);
  return b;
}

void run_bench(const BenchOptions& o) {
  kernels::ThreadPool pool(o.threads);
  tiering::Ledger ledger;
  kernels::BandwidthOptions bw_options;
  bw_options.ledger = &ledger;
  const double read_gbs = kernels::measure_read_bandwidth_gbs(pool, size_t(1) << 30, bw_options);
  std::printf("threads %d, measured read bandwidth %.2f GB/s\n", pool.size(), read_gbs);
  std::printf("%-6s %9s %11s %13s %11s %9s %12s\n", "format", "weights", "bytes/tok", "roofline t/s", "decode t/s",
              "of roof", "prefill t/s");
  model::ModelConfig config = model::llama_1b_config();
  if (o.layers > 0) config.num_layers = o.layers;
  for (const auto& name : o.formats) {
    const auto format = kernels::parse_format(name);
    model::ModelWeights m = model::synthetic_model(config, format, ledger);
    const int64_t context = o.prefill_tokens + o.decode_tokens + 8;
    engine::Forward forward(m, pool, ledger, o.prefill_tokens, context);
    engine::Generator generator(forward, ledger, context);
    engine::GenerationRequest request;
    for (int64_t i = 0; i < o.prefill_tokens; ++i) request.prompt.push_back(int32_t((i * 7919) % config.vocab_size));
    request.max_tokens = o.decode_tokens;
    request.ignore_stop_tokens = true;
    auto stats = generator.generate(request, [](int32_t) { return true; });
    const double bpt = double(bytes_per_token(m));
    const double roof = read_gbs * 1e9 / bpt;
    // generated_tokens counts the first sampled token, which needs no extra forward; decode_seconds covers
    // generated_tokens - 1 forward steps.
    const double decode_tps = double(stats.generated_tokens - 1) / stats.decode_seconds;
    std::printf("%-6s %7.2fGB %9.1fMB %13.1f %11.2f %8.1f%% %12.1f\n", name.c_str(), double(m.bytes()) / 1e9,
                bpt / 1e6, roof, decode_tps, 100.0 * decode_tps / roof, stats.prefill_tokens_per_second());
    std::fflush(stdout);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Decode/prefill tok/s of a synthetic 1B-class llama vs the RAM roofline");
  cmd->add_option("--formats", options->formats, "Weight formats to measure")->delimiter(',');
  cmd->add_option("--threads", options->threads, "Worker threads (0: one per physical core)");
  cmd->add_option("--decode-tokens", options->decode_tokens, "Tokens to decode")->check(CLI::Range(2, 4096));
  cmd->add_option("--prefill-tokens", options->prefill_tokens, "Prompt tokens to prefill")->check(CLI::Range(1, 4096));
  cmd->add_option("--layers", options->layers, "Override the layer count (0: 16)")->check(CLI::Range(0, 256));
  add_bench_profile_command(*cmd);
  cmd->callback([options, cmd] {
    if (!cmd->got_subcommand("profile")) run_bench(*options);
  });
}

}  // namespace tierlm::cli
