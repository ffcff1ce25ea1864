// gpu_bench — the CUDA backend on the device machine: decode and prefill tok/s of the synthetic 1B-class llama
// (bf16, q8_0 and q4) and of a synthetic Qwen3-MoE (q4 experts through the VRAM expert tier), all layers on the GPU and
// split with the CPU, next to the memory roofline measured in the same run (a device-to-device copy, bytes read +
// written). Decode fraction of roofline = bytes of weights read per token / time per token / d2d bandwidth.
// A plain main (no Google Benchmark fixtures): one table, for the closing notes. Prints the reason and exits 0
// without a GPU. Usage: gpu_bench [--quick] [--no-chains] [--no-moe] [--formats bf16,q8_0,q4 (also f16)]
//        [--matvec-ab (only the tensor-core / CUDA-core packed matvec variants)] [--table-prompt N]
//        [--chain R,C,MODE,FORMAT[,MMA] | --attention H,KVH,HD,LEN (one kernel alone, for ncu)]
//        [--moe-dir DIR]
//        gpu_bench --attention-heads: decode attention alone at Gemma-4-26B-A4B's head shapes (head_dim 256 and 512).
//        gpu_bench --first-use FORMAT [--prompt N] [--long N]: a process's first prompt on the 1B shape (run it as a
//        fresh process per format): the GpuLayers setup phases, the first and the steady prefill of N tokens (wall
//        and per-operation device time), and a steady prefill of --long tokens.
//        gpu_bench --model HF_DIR [--formats f16,q8_0,q4] [--prompt N] [--long N] [--decode N]: the peer run
//        (bench/peer/llamacpp_cuda.sh runs llama-bench on GGUFs written from the same folder): loads the folder in
//        each format, every layer and the head on the GPU, and prints one JSON line per format: steady prefill
//        tok/s of N and --long tokens (median of 3 after a warm-up, as llama-bench's pp), decode tok/s of --decode
//        greedy steps from position 8 (as llama-bench's tg at depth 0), and the d2d roofline of the same run.
//        TIERLM_PEER_PROFILE=1: then a profiled pass prints each prompt's and 32 decode steps' device time per
//        operation to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "runtime/engine/forward.h"
#include "runtime/engine/sampler.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/gpu/gpu_probe.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic.h"
#include "runtime/model/synthetic_moe.h"

using namespace tierlm;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Speed {
  double prefill_tps = 0, decode_tps = 0;
};

// Prefill `prompt` tokens in one chunk, then `decode` greedy steps (after 4 warm-up steps). The greedy token is
// asked of Forward (BatchItem::greedy: with a GPU head it is reduced on the device, as the scheduler and the
// generator do for greedy requests), or, with host_logits, taken by engine::argmax of the logits copied back (the
// path of sampled requests and of logprobs).
Speed measure(const model::ModelWeights& w, std::shared_ptr<gpu::GpuLayers> g, int64_t prompt, int decode,
              int threads, const std::function<void()>& before_decode = {}, bool host_logits = false) {
  tiering::Ledger ledger;
  kernels::ThreadPool pool(threads);
  const int64_t context = prompt + decode + 8;
  engine::Forward forward(w, pool, ledger, prompt, context);
  if (g) forward.use_gpu(g);
  engine::KVCache cache(w.config, context, ledger);
  std::vector<int32_t> tokens(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13) % w.config.vocab_size);
  std::vector<float> logits(static_cast<size_t>(w.config.vocab_size));
  Speed s;
  {  // warm-up prefill (module load, cuBLAS heuristics), then the timed one over the same positions
    forward.run(tokens, 0, cache, logits.data());
    const double t0 = now();
    forward.run(tokens, 0, cache, logits.data());
    s.prefill_tps = double(prompt) / (now() - t0);
  }
  int64_t pos = prompt;
  int32_t next = 1;
  int32_t greedy = -1;
  auto step = [&] {
    const engine::BatchItem item{std::span(&next, 1), pos++, &cache, logits.data(), false,
                                 host_logits ? nullptr : &greedy};
    forward.run_batch(std::span(&item, 1));
    next = host_logits ? int32_t(engine::argmax(logits)) : greedy;
  };
  for (int i = 0; i < 4; ++i) step();
  if (before_decode) before_decode();
  const double t0 = now();
  for (int i = 0; i < decode; ++i) step();
  s.decode_tps = decode / (now() - t0);
  return s;
}

void row(const char* model, const char* placement, const Speed& s, double bytes_per_token, double roofline) {
  const double achieved = bytes_per_token * s.decode_tps;
  std::printf("%-22s %-26s %10.1f %10.1f %12.1f %9.1f%%\n", model, placement, s.prefill_tps, s.decode_tps,
              achieved / 1e9, roofline > 0 ? 100.0 * achieved / roofline : 0.0);
  std::fflush(stdout);
}

// A process's first prompt: setup phases, first vs steady prefill (all layers + head on the GPU, greedy token).
int first_use(kernels::WeightFormat format, int64_t prompt, int64_t long_prompt) {
  const double t_load = now();
  tiering::Ledger ledger;
  const model::ModelWeights w = model::synthetic_model(model::llama_1b_config(), format, ledger);
  const int64_t chunk = std::max(prompt, long_prompt), context = chunk + 64;
  std::printf("first use, llama-1B %s: synthetic weights %.0f ms\n", kernels::format_name(format),
              1e3 * (now() - t_load));
  const double t_ctor = now();
  gpu::GpuOptions o;
  o.layers = w.config.num_layers;
  o.profile = true;
  auto g = std::make_shared<gpu::GpuLayers>(w, o, chunk, context);
  std::printf("  GpuLayers constructor %.1f ms:\n%s", 1e3 * (now() - t_ctor), g->setup_report().c_str());
  tiering::Ledger host;
  kernels::ThreadPool pool(4);
  engine::Forward forward(w, pool, host, chunk, context);
  forward.use_gpu(g);
  std::vector<int32_t> tokens(static_cast<size_t>(chunk));
  for (int64_t i = 0; i < chunk; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13) % w.config.vocab_size);
  std::vector<float> logits(static_cast<size_t>(w.config.vocab_size));
  int32_t greedy = -1;
  // A prompt of n tokens as the generator runs it: one chunk, greedy on the device.
  auto prefill = [&](int64_t n, engine::KVCache& cache) {
    const engine::BatchItem item{std::span(tokens.data(), size_t(n)), 0, &cache, logits.data(), false, &greedy};
    const double t0 = now();
    forward.run_batch(std::span(&item, 1));
    return now() - t0;
  };
  auto decode_step = [&](engine::KVCache& cache, int64_t pos) {
    const engine::BatchItem item{std::span(&greedy, 1), pos, &cache, logits.data(), false, &greedy};
    const double t0 = now();
    forward.run_batch(std::span(&item, 1));
    return now() - t0;
  };
  for (int pass = 0; pass < 3; ++pass) {
    engine::KVCache cache(w.config, context, host);
    g->reset_profile();
    const double s = prefill(prompt, cache);
    std::printf("  %s prefill of %lld tokens: %.2f ms wall = %.0f tok/s; device per operation:\n%s",
                pass == 0 ? "first" : "next ", (long long)prompt, 1e3 * s, double(prompt) / s,
                g->profile_report().c_str());
    const double d = decode_step(cache, prompt);
    std::printf("  %s decode step %.3f ms\n", pass == 0 ? "first" : "next ", 1e3 * d);
    g->forget(&cache);
  }
  // Without the profiling events (the product's path): medians of 5.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  o.profile = false;
  g.reset();
  g = std::make_shared<gpu::GpuLayers>(w, o, chunk, context);
  forward.use_gpu(g);
  for (int64_t n : {prompt, long_prompt}) {
    if (n <= 0) continue;
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      engine::KVCache cache(w.config, context, host);
      times.push_back(prefill(n, cache));
      g->forget(&cache);
    }
    std::printf("  steady prefill of %lld tokens: %.2f ms = %.0f tok/s (first of 5 on a fresh GpuLayers: %.2f ms)\n",
                (long long)n, 1e3 * median(times), double(n) / median(times), 1e3 * times[0]);
  }
  return 0;
}

// The peer run on an HF folder (see the usage above).
int peer(const std::string& dir, const std::string& formats, int64_t prompt, int64_t long_prompt, int decode) {
  const auto probe = gpu::probe_gpu(false);
  const double roofline = probe->d2d_bytes_per_second;
  std::printf("{\"device\":\"%s\",\"d2d_gbps\":%.1f}\n", probe->name.c_str(), roofline / 1e9);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (size_t at = 0; at < formats.size();) {
    const size_t comma = std::min(formats.find(',', at), formats.size());
    const std::string format = formats.substr(at, comma - at);
    at = comma + 1;
    tiering::Ledger ledger;
    model::LoadOptions lo;
    lo.ledger = &ledger;
    lo.weight_format = kernels::parse_format(format);
    const model::ModelWeights w = model::load_model(dir, lo);
    const int64_t chunk = std::max(prompt, long_prompt), context = chunk + decode + 64;
    gpu::GpuOptions o;
    o.layers = w.config.num_layers;
    auto g = std::make_shared<gpu::GpuLayers>(w, o, chunk, context);
    kernels::ThreadPool pool(4);
    engine::Forward forward(w, pool, ledger, chunk, context);
    forward.use_gpu(g);
    // Token ids spread over the vocabulary (tierlm_peer's prompt).
    std::vector<int32_t> tokens(static_cast<size_t>(chunk));
    for (int64_t i = 0; i < chunk; ++i) tokens[size_t(i)] = int32_t(300 + (i * 7919) % (w.config.vocab_size - 300));
    std::vector<float> logits(static_cast<size_t>(w.config.vocab_size));
    int32_t greedy = -1;
    auto run = [&](std::span<const int32_t> ids, int64_t pos, engine::KVCache& cache) {
      const engine::BatchItem item{ids, pos, &cache, logits.data(), false, &greedy};
      forward.run_batch(std::span(&item, 1));
    };
    // One prompt of n tokens on a fresh sequence; then (decode) `steps` greedy steps after an 8-token prompt and 4
    // warm-up steps. `before` runs just before the timed part. Seconds of the timed part.
    auto prefill_seconds = [&](int64_t n, const std::function<void()>& before) {
      engine::KVCache cache(w.config, context, ledger);
      before();
      const double t0 = now();
      run(std::span(tokens.data(), size_t(n)), 0, cache);
      const double seconds = now() - t0;
      g->forget(&cache);
      return seconds;
    };
    auto decode_seconds = [&](int steps, const std::function<void()>& before) {
      engine::KVCache cache(w.config, context, ledger);
      run(std::span(tokens.data(), 8), 0, cache);
      int64_t pos = 8;
      for (int i = 0; i < 4; ++i, ++pos) run(std::span(&greedy, 1), pos, cache);
      before();
      const double t0 = now();
      for (int i = 0; i < steps; ++i, ++pos) run(std::span(&greedy, 1), pos, cache);
      const double seconds = now() - t0;
      g->forget(&cache);
      return seconds;
    };
    const auto nothing = [] {};
    double tps[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const int64_t n = k == 0 ? prompt : long_prompt;
      if (n <= 0) continue;
      std::vector<double> times;
      for (int i = 0; i < 4; ++i) {  // the first is the warm-up
        const double t = prefill_seconds(n, nothing);
        if (i > 0) times.push_back(t);
      }
      tps[k] = double(n) / median(times);
    }
    std::vector<double> decode_tps;
    for (int r = 0; r < 3; ++r) decode_tps.push_back(decode / decode_seconds(decode, nothing));
    const double d = median(decode_tps), bytes = double(g->weight_bytes());
    if (const char* e = std::getenv("TIERLM_PEER_PROFILE"); e && *e == '1') {
      // Where the device time of a step goes (stderr): a profiled GpuLayers (CUDA events around each launch group,
      // which slow the step), one prefill of each prompt length after a warm-up, then 32 decode steps.
      o.profile = true;
      g.reset();
      g = std::make_shared<gpu::GpuLayers>(w, o, chunk, context);
      forward.use_gpu(g);
      const auto reset = [&] { g->reset_profile(); };
      for (int64_t n : {prompt, long_prompt}) {
        if (n <= 0) continue;
        prefill_seconds(n, reset);  // the warm-up
        const double t = prefill_seconds(n, reset);
        std::fprintf(stderr, "profile %s prefill of %lld tokens: %.2f ms wall; device ms per operation:\n%s",
                     format.c_str(), (long long)n, 1e3 * t, g->profile_report().c_str());
      }
      const double t = decode_seconds(32, reset);
      std::fprintf(stderr, "profile %s decode, 32 steps: %.1f us a step wall; device ms per operation (32 steps):\n%s",
                   format.c_str(), 1e6 * t / 32, g->profile_report().c_str());
    }
    std::printf("{\"engine\":\"tierlm\",\"format\":\"%s\",\"layers\":%lld,\"weight_bytes\":%.0f,"
                "\"pp%lld\":%.1f,\"pp%lld\":%.1f,\"tg%d\":%.1f,\"of_roofline\":%.4f}\n",
                format.c_str(), (long long)w.config.num_layers, bytes, (long long)prompt, tps[0],
                (long long)long_prompt, tps[1], decode, d, bytes * d / roofline);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, dense_only = false, chains = true, moe = true, matvec_ab = false, attention_heads = false;
  std::string formats = "bf16,q8_0,q4";
  int64_t table_prompt = 512;
  std::string moe_dir = "/tmp/tierlm_gpu_bench_moe", first_use_format, peer_dir;
  int64_t first_use_prompt = 180, first_use_long = 1800;
  int peer_decode = 128;
  // For a profiler (ncu): --chain ROWS,COLS,MODE,FORMAT,MMA (MODE 0 plain / 1 normed / 2 gated, FORMAT 2 bf16 / 3
  // q8_0 / 4 q4, MMA 1 tensor cores / 0 CUDA cores) times that one chain; --attention HEADS,KV_HEADS,HEAD_DIM,LEN
  // that one decode attention (fused). Nothing else runs.
  std::string one_chain, one_attention;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--dense-only")) dense_only = true;  // bf16 llama only (for profilers)
    if (!std::strcmp(argv[i], "--no-chains")) chains = false;
    if (!std::strcmp(argv[i], "--no-moe")) moe = false;
    if (!std::strcmp(argv[i], "--matvec-ab")) matvec_ab = true;  // only the tensor-core / CUDA-core matvec variants
    if (!std::strcmp(argv[i], "--attention-heads")) attention_heads = true;
    if (!std::strcmp(argv[i], "--formats") && i + 1 < argc) formats = argv[++i];
    if (!std::strcmp(argv[i], "--table-prompt") && i + 1 < argc) table_prompt = std::atoll(argv[++i]);
    if (!std::strcmp(argv[i], "--moe-dir") && i + 1 < argc) moe_dir = argv[++i];
    if (!std::strcmp(argv[i], "--first-use") && i + 1 < argc) first_use_format = argv[++i];
    if (!std::strcmp(argv[i], "--prompt") && i + 1 < argc) first_use_prompt = std::atoll(argv[++i]);
    if (!std::strcmp(argv[i], "--long") && i + 1 < argc) first_use_long = std::atoll(argv[++i]);
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) peer_dir = argv[++i];
    if (!std::strcmp(argv[i], "--decode") && i + 1 < argc) peer_decode = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--chain") && i + 1 < argc) one_chain = argv[++i];
    if (!std::strcmp(argv[i], "--attention") && i + 1 < argc) one_attention = argv[++i];
  }
  if (!gpu::gpu_available()) {
    std::printf("gpu_bench: skipped, %s\n", gpu::gpu_unavailable_reason().c_str());
    return 0;
  }
  if (!one_chain.empty() || !one_attention.empty()) {
    long long a = 0, b = 0, c = 0, d = 0, e = 1;
    if (!one_chain.empty()) {
      if (std::sscanf(one_chain.c_str(), "%lld,%lld,%lld,%lld,%lld", &a, &b, &c, &d, &e) < 4) {
        std::fprintf(stderr, "gpu_bench: --chain wants ROWS,COLS,MODE,FORMAT[,MMA], got '%s'\n", one_chain.c_str());
        return 2;
      }
      const auto t = gpu::probe_kernel_chain(a, b, 4, int(c), int(d), e != 0);
      if (!t) {
        std::fprintf(stderr, "gpu_bench: the chain %s did not run (shape or format not supported)\n",
                     one_chain.c_str());
        return 1;
      }
      std::printf("chain %lld x %lld mode %lld format %lld %s: %.2f / %.2f us\n", a, b, c, d, e ? "mma" : "cuda",
                  t->plain_us, t->programmatic_us);
    }
    if (!one_attention.empty()) {
      if (std::sscanf(one_attention.c_str(), "%lld,%lld,%lld,%lld", &a, &b, &c, &d) != 4) {
        std::fprintf(stderr, "gpu_bench: --attention wants HEADS,KV_HEADS,HEAD_DIM,LEN, got '%s'\n",
                     one_attention.c_str());
        return 2;
      }
      const auto t = gpu::probe_attention(a, b, c, d, true);
      if (!t) {
        std::fprintf(stderr, "gpu_bench: the attention %s did not run\n", one_attention.c_str());
        return 1;
      }
      std::printf("attention %lld/%lld heads of %lld, %lld positions: %.2f us\n", a, b, c, d, *t);
    }
    return 0;
  }
  if (!peer_dir.empty()) return peer(peer_dir, formats, first_use_prompt, first_use_long, peer_decode);
  if (!first_use_format.empty())
    return first_use(kernels::parse_format(first_use_format), first_use_prompt, first_use_long);
  if (attention_heads) {
    // Decode attention at Gemma-4-26B-A4B's shapes (16 heads; sliding layers 8 KV heads of 256, full layers 2 KV
    // heads of 512, global_head_dim) and 2 KV heads of 256 beside them: the same group, half the head. Gemma 4's
    // layers run it plain (the rows are turned and stored first), f16 device KV.
    std::printf("decode attention, f16 KV, us per launch (one layer):\n");
    for (const auto& [kv_heads, head_dim] : {std::pair<int64_t, int64_t>{8, 256}, {2, 256}, {2, 512}})
      for (int64_t len : {1024, 4096, 32768}) {
        std::printf("  16 heads, %lld KV heads, head_dim %lld, len %5lld:", (long long)kv_heads, (long long)head_dim,
                    (long long)len);
        for (bool fused : {false, true})
          if (const auto t = gpu::probe_attention(16, kv_heads, head_dim, len, fused))
            std::printf("  %s %.2f", fused ? "fused" : "plain", *t);
        std::printf("\n");
      }
    // Where the time of the widest goes (plain, len 4096): phases skipped (device::set_attention_debug's mask).
    std::printf("  head_dim 512, 2 KV heads, len 4096 plain, skipping:");
    for (const auto& [mask, what] : {std::pair<int, const char*>{1, "merge"}, {64 | 1, "scores loop, merge"},
                                     {128 | 1, "values pass, merge"}, {4 | 8, "K/V loads"}})
      if (const auto t = gpu::probe_attention(16, 2, 512, 4096, false, mask)) std::printf("  %s %.2f", what, *t);
    std::printf("\n");
    return 0;
  }
  const auto probe = gpu::probe_gpu(quick);
  const double roofline = probe->d2d_bytes_per_second;
  std::printf("device: %s (cc %d, %d SMs), %.1f GiB, d2d copy %.0f GB/s (roofline), pinned h2d %.1f GB/s, "
              "f16 GEMM %.0f TFLOP/s\n",
              probe->name.c_str(), probe->compute_capability, probe->multiprocessors,
              double(probe->total_bytes) / (1 << 30), roofline / 1e9, probe->h2d_pinned_bytes_per_second / 1e9,
              probe->gemm_f16_flops / 1e12);
  // Per-kernel cost of the decode matvec alone, on the llama-1B shapes (qkv, o, gate_up, down, head), bf16 and the
  // packed q8_0 / q4 (mode: plain, normed = RMSNorm fused, gated = SiLU gate fused), and the packed llama-8B shapes.
  std::printf("decode matvec chains (one CUDA graph of distinct matrices): us per kernel, plain / programmatic "
              "launch, vs bytes at the roofline\n");
  for (const auto& [rows, cols, count, mode, format] :
       {std::tuple<int64_t, int64_t, int, int, int>{3072, 2048, 16, 0, 2}, {3072, 2048, 16, 1, 2}, {2048, 2048, 16, 0, 2},
        {16384, 2048, 8, 0, 2}, {16384, 2048, 8, 1, 2}, {2048, 8192, 8, 0, 2}, {2048, 8192, 8, 2, 2},
        {128256, 2048, 2, 0, 2}, {3072, 2048, 16, 0, 3}, {3072, 2048, 16, 1, 3}, {2048, 2048, 16, 0, 3}, {16384, 2048, 8, 0, 3},
        {16384, 2048, 8, 1, 3}, {2048, 8192, 8, 0, 3}, {2048, 8192, 8, 2, 3}, {128256, 2048, 2, 0, 3},
        {3072, 2048, 16, 1, 4}, {2048, 2048, 16, 0, 4}, {16384, 2048, 8, 1, 4}, {2048, 8192, 8, 2, 4},
        {128256, 2048, 2, 0, 4},
        // Llama-3-8B's shapes (qkv, o, gate_up, down, head), where the weights rather than the launches should dominate
        {6144, 4096, 8, 1, 3}, {4096, 4096, 8, 0, 3}, {28672, 4096, 4, 1, 3}, {4096, 14336, 4, 2, 3},
        {128256, 4096, 2, 0, 3}, {6144, 4096, 8, 1, 4}, {4096, 4096, 8, 0, 4}, {28672, 4096, 4, 1, 4},
        {4096, 14336, 4, 2, 4}, {128256, 4096, 2, 0, 4}}) {
    if (!chains) break;
    // Packed formats twice: the tensor-core kernel ("mma") and the CUDA-core one ("cuda").
    for (bool mma : {true, false}) {
      if (format == 2 && !mma) continue;
      if (const auto c = gpu::probe_kernel_chain(rows, cols, count, mode, format, mma))
        std::printf("    %-4s %-4s %6lld x %-5lld %-6s %8.2f / %8.2f us  (streaming %7.2f us: %5.1f%% / %5.1f%% of "
                    "roofline)\n",
                    format == 2 ? "bf16" : format == 3 ? "q8_0" : "q4", format == 2 ? "" : mma ? "mma" : "cuda",
                    (long long)rows, (long long)cols, mode == 1 ? "normed" : mode == 2 ? "gated" : "", c->plain_us,
                    c->programmatic_us, 1e6 * c->bytes / roofline, 100.0 * 1e6 * c->bytes / roofline / c->plain_us,
                    100.0 * 1e6 * c->bytes / roofline / c->programmatic_us);
    }
  }
  // Decode attention alone (llama-1B shape), and with phases skipped, to see where its time goes.
  if (chains) {
    std::printf("decode attention (32 heads, 8 KV heads, head_dim 64), us per launch:");
    for (int64_t len : {80, 640, 4096})
      for (bool fused : {true, false})
        if (const auto t = gpu::probe_attention(32, 8, 64, len, fused))
          std::printf("  len %lld %s %.2f", (long long)len, fused ? "fused" : "plain", *t);
    std::printf("\n    Llama-3-8B's shape (32 heads, 8 KV heads, head_dim 128), us per launch:");
    for (int64_t len : {160, 640, 4096})
      if (const auto t = gpu::probe_attention(32, 8, 128, len, true))
        std::printf("  len %lld fused %.2f", (long long)len, *t);
    std::printf("\n    len 640 fused, skipping:");
    for (const auto& [mask, what] : {std::pair<int, const char*>{1, "merge"}, {4, "key loads"}, {8, "value loads"},
                                     {16, "prefetch"}, {32, "rope/store"}, {1 | 4 | 8 | 32, "all but q"},
                                     {64 | 1, "scores loop, merge"}, {128 | 1, "values pass, merge"},
                                     {512 | 32, "all after q"}, {1024, "all after the wait"},
                                     {2048, "K/V staging (loads from global)"}})
      if (const auto t = gpu::probe_attention(32, 8, 64, 640, true, mask)) std::printf("  %s %.2f", what, *t);
    std::printf("\n");
  }
  std::printf("%-22s %-26s %10s %10s %12s %10s\n", "model", "placement", "prefill/s", "decode/s", "weights GB/s",
              "roofline");
  const int threads = 16;
  const int decode = quick ? 16 : 128;
  const int64_t prompt = quick ? 64 : table_prompt;

  for (kernels::WeightFormat format :
       {kernels::WeightFormat::f16, kernels::WeightFormat::bf16, kernels::WeightFormat::q8_0,
        kernels::WeightFormat::q4}) {
    if (dense_only && format != kernels::WeightFormat::bf16) continue;
    if (("," + formats + ",").find(std::string(",") + kernels::format_name(format) + ",") == std::string::npos)
      continue;
    tiering::Ledger ledger;
    const model::ModelWeights w = model::synthetic_model(model::llama_1b_config(), format, ledger);
    const std::string name = std::string("llama-1B ") + kernels::format_name(format);
    // A/B variants of the same build: plain launches (no programmatic dependent launch), and (packed formats) the
    // CUDA-core decode matvec instead of the tensor-core one.
    struct Variant {
      const char* label;
      bool programmatic;
      int rows;
      bool host_logits;
      bool packed_mma = true;
      bool packed_mma_all = false;
    };
    {  // warm-up (clocks, module load, cuBLAS heuristics), not reported
      gpu::GpuOptions o;
      o.layers = w.config.num_layers;
      auto g = std::make_shared<gpu::GpuLayers>(w, o, prompt, prompt + decode + 8);
      measure(w, g, prompt, decode, threads);
    }
    // Each variant twice, interleaved, so drift shows.
    // "logits to host": the logits come back and the host takes the argmax (sampled requests, logprobs).
    // Packed formats: the default matvec choice (tensor cores for matrices of >= 6144 rows), every matrix on the
    // CUDA cores, every one on the tensor cores.
    for (const Variant& v :
         {Variant{"all GPU (16/16 + head)", true, 0, false}, Variant{"all GPU, logits to host", true, 0, true},
          Variant{"all GPU, plain launches", false, 0, false},
          Variant{"all GPU, CUDA-core matvec", true, 0, false, false},
          Variant{"all GPU, tensor-core matvec", true, 0, false, true, true},
          Variant{"all GPU (16/16 + head)", true, 0, false},
          Variant{"all GPU, logits to host", true, 0, true},
          Variant{"all GPU, plain launches", false, 0, false},
          Variant{"all GPU, CUDA-core matvec", true, 0, false, false},
          Variant{"all GPU, tensor-core matvec", true, 0, false, true, true}}) {
      if (format != kernels::WeightFormat::bf16 && v.rows != 0) continue;
      const bool packed = format == kernels::WeightFormat::q8_0 || format == kernels::WeightFormat::q4;
      if (!packed && (!v.packed_mma || v.packed_mma_all)) continue;
      if (matvec_ab && (v.host_logits || !v.programmatic)) continue;
      gpu::GpuOptions o;
      o.layers = w.config.num_layers;
      o.programmatic_launch = v.programmatic;
      o.dense_rows_per_block = v.rows;
      o.packed_mma = v.packed_mma;
      o.packed_mma_all = v.packed_mma_all;
      o.time_steps = true;
      auto g = std::make_shared<gpu::GpuLayers>(w, o, prompt, prompt + decode + 8);
      const Speed sp = measure(w, g, prompt, decode, threads, [&] { g->reset_profile(); }, v.host_logits);
      row(name.c_str(), v.label, sp, double(g->weight_bytes()), roofline);
      // What the planner's GPU cost model charges beyond bytes / bandwidth (calibrate: kGpuLayerOverheadSeconds).
      const double step = 1.0 / sp.decode_tps, streaming = double(g->weight_bytes()) / roofline;
      std::printf("    step %.1f us (device %.1f us, host %.1f us) = weights / roofline %.1f us + %.1f us (%.1f us per "
                  "layer beyond streaming)\n",
                  1e6 * step, g->device_step_us(), 1e6 * step - g->device_step_us(), 1e6 * streaming,
                  1e6 * (step - streaming), 1e6 * (step - streaming) / double(w.config.num_layers));
    }
    if (!matvec_ab) {
      gpu::GpuOptions o;
      o.layers = w.config.num_layers / 2;
      auto g = std::make_shared<gpu::GpuLayers>(w, o, prompt, prompt + decode + 8);
      row(name.c_str(), "split (8 GPU / 8 CPU+head)", measure(w, g, prompt / 4, decode / 4, threads),
          double(g->weight_bytes()), 0);
    }
    {
      // Where a decode step's device time goes (events around each operation; slows the step a little).
      gpu::GpuOptions o;
      o.layers = w.config.num_layers;
      o.profile = true;
      auto g = std::make_shared<gpu::GpuLayers>(w, o, prompt, prompt + decode + 8);
      const Speed s = measure(w, g, prompt, decode, threads, [&] { g->reset_profile(); });
      std::printf("    decode profile, all GPU (%.1f tok/s while profiling = %.1f us/token wall):\n%s",
                  s.decode_tps, 1e6 / s.decode_tps, g->profile_report().c_str());
    }
  }

  if (dense_only || !moe) return 0;
  // Synthetic MoE (the tiering issue's shape, fewer layers so it writes fast): q4 experts in a packed file.
  model::SyntheticMoeSpec spec;
  spec.layers = quick ? 4 : 8;
  spec.experts = 32;
  spec.top_k = 8;
  std::filesystem::create_directories(moe_dir);
  if (!std::filesystem::exists(std::filesystem::path(moe_dir) / "experts.tierlm") ||
      std::filesystem::file_size(std::filesystem::path(moe_dir) / "experts.tierlm") !=
          model::synthetic_moe_expert_bytes(spec))
    model::write_synthetic_moe(moe_dir, spec);
  tiering::Ledger ledger;
  model::LoadOptions lo;
  lo.ledger = &ledger;
  lo.weight_format = kernels::WeightFormat::q4;
  // The host cache holds every expert, so VRAM misses measure the pinned RAM -> VRAM path, not the disk.
  lo.experts.cache.slots = spec.layers * spec.experts;
  lo.experts.cache.prefetch_limit = 0;
  const model::ModelWeights w = model::load_model(moe_dir, lo);
  const std::string name = "qwen3-moe-synth q4 " + std::to_string(spec.layers) + "L";
  struct Case {
    const char* placement;
    int64_t layers;
    bool all_resident;
    int64_t slots;
  };
  for (const Case& c : {Case{"all GPU, experts in VRAM", spec.layers, true, 0},
                        Case{"all GPU, 16 VRAM slots", spec.layers, false, 16},
                        Case{"split (half GPU, VRAM)", spec.layers / 2, true, 0}}) {
    gpu::GpuOptions o;
    o.layers = c.layers;
    o.expert_slots = c.slots;
    if (c.all_resident)
      for (int64_t l = 0; l < c.layers; ++l)
        for (int64_t e = 0; e < spec.experts; ++e) o.resident_experts.push_back({l, e});
    auto g = std::make_shared<gpu::GpuLayers>(w, o, prompt, prompt + decode + 8);
    // Bytes per decode token: dense weights + top_k experts per GPU layer.
    const uint64_t expert_bytes = w.experts->store().layout().payload_bytes();
    const uint64_t resident = g->vram_ledger().used("resident_experts");
    const double dense = double(g->weight_bytes());
    const double per_token = dense + double(c.layers * spec.top_k) * double(expert_bytes);
    const Speed s = measure(w, g, c.layers == spec.layers ? prompt : prompt / 4, c.layers == spec.layers ? decode : decode / 4, threads);
    row(name.c_str(), c.placement, s, c.layers == spec.layers ? per_token : 0,
        c.layers == spec.layers ? roofline : 0);
    const gpu::GpuExpertStats st = g->expert_stats();
    std::printf("    vram tier: resident %.0f MB, hits resident %llu slot %llu, misses %llu, copied %.1f MB; %llu layer "
                "steps routed on the device\n",
                double(resident) / 1e6, (unsigned long long)st.resident_hits, (unsigned long long)st.slot_hits,
                (unsigned long long)st.misses, double(st.bytes_copied) / 1e6, (unsigned long long)st.device_routed);
  }
  return 0;
}
