// `tierlm run` — load a Hugging Face model folder, stream the completion of a prompt to stdout, report tok/s.
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "calibrate/apply_plan.h"
#include "calibrate/calibration.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/model_setup.h"
#include "runtime/engine/forward.h"
#include "runtime/kv/codec.h"
#include "runtime/engine/generator.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::cli {

namespace {

struct RunOptions {
  std::string model = default_model_dir();
  std::string prompt = "Return the number of";
  int64_t max_tokens = 64;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  int threads = 0;
  std::string weight_format;  // empty: as stored
  int64_t context = 2048;
  int64_t prefill_chunk = 128;
  double mem_budget_gib = 0;  // 0: unlimited
  bool ignore_eos = false;
  int64_t gpu_layers = 0;  // layers [0, n) on the GPU (CUDA builds); more than the model has: all of them
  gpu::GpuOptions gpu_plan;  // the plan's VRAM expert set and device KV codec, when the plan chose gpu_layers
  std::string kv_codec = "f32";
  std::string wisdom;                         // wisdom file ("" : the XDG default)
  std::string on_missing_wisdom = "calibrate";  // or "refuse"
  bool no_wisdom = false;                     // explicit flags and defaults only
};

// The plan for this machine and model, applied to every setting the user did not pass explicitly; the expert
// tier's cache and reader settings go into `load`.
RunOptions with_plan(RunOptions o, const CLI::App& cmd, model::LoadOptions& load) {
  if (o.no_wisdom) return o;
  calibrate::CalibrateOptions c;
  c.model_dir = o.model;
  if (!o.wisdom.empty()) c.wisdom_path = o.wisdom;
  c.weight_format = o.weight_format;
  c.context = o.context;
  c.fit_batch = true;  // run decodes one sequence: the serving batch the plan is made for may be lowered to fit
  const calibrate::ResolvedPlan resolved = calibrate::resolve_plan(c, calibrate::parse_missing_wisdom(o.on_missing_wisdom));
  const calibrate::Plan& plan = resolved.entry.plan;
  if (!cmd.count("--threads")) o.threads = plan.threads;
  if (!cmd.count("--prefill-chunk")) o.prefill_chunk = plan.prefill_chunk;
  if (!cmd.count("--mem-budget")) o.mem_budget_gib = double(plan.budget_bytes) / double(1ull << 30);
  if (!cmd.count("--kv-codec")) o.kv_codec = plan.kv_codec;
  if (!cmd.count("--gpu-layers")) {
    o.gpu_layers = plan.gpu_layers;
    o.gpu_plan = calibrate::gpu_options(plan);
  }
  if (resolved.entry.model.moe()) load.experts = calibrate::expert_tier_options(plan);
  calibrate::set_active_plan(resolved.entry);
  std::fprintf(stderr, "wisdom: plan %s/%s: %d threads, prefill chunk %lld, KV %s, budget %.2f GiB, %lld resident "
               "experts, %lld cache slots, %lld GPU layers (predicted %.1f tok/s)\n",
               plan.device_fingerprint.c_str(), plan.model_fingerprint.c_str(), o.threads, (long long)o.prefill_chunk,
               o.kv_codec.c_str(), o.mem_budget_gib, (long long)plan.resident_count(), (long long)plan.cache_slots,
               (long long)o.gpu_layers, plan.prediction.decode_tokens_per_second);
  return o;
}

void run(const RunOptions& given, const CLI::App& cmd) {
  model::LoadOptions load;
  const RunOptions o = with_plan(given, cmd, load);
  LoadedModel loaded = load_for_cli(o.model, o.mem_budget_gib, o.weight_format, load);
  tiering::Ledger& ledger = *loaded.ledger;
  const tok::Tokenizer& tokenizer = loaded.tokenizer;
  model::ModelWeights& weights = loaded.weights;

  const auto& config = weights.config;
  const int64_t context = std::min<int64_t>(o.context, config.max_position_embeddings);
  kernels::ThreadPool pool(o.threads);
  engine::Forward forward(weights, pool, ledger, o.prefill_chunk, context);
  kv::set_default_codec(kv::parse_codec(o.kv_codec));  // the generator's cache takes the process default
  std::shared_ptr<gpu::GpuLayers> gpu_layers;
  if (o.gpu_layers > 0) {
    gpu::GpuOptions gpu_options = o.gpu_plan;
    gpu_options.layers = o.gpu_layers;
    // A codec the user named holds on the GPU layers too (f32: the exact configuration), or is refused there by name.
    if (cmd.count("--kv-codec")) calibrate::apply_kv_codec_to_gpu(o.kv_codec, gpu_options);
    gpu_options.host_ledger = &ledger;
    gpu_layers = std::make_shared<gpu::GpuLayers>(weights, gpu_options, o.prefill_chunk, context);
    forward.use_gpu(gpu_layers);
    std::fprintf(stderr, "gpu: %lld of %lld layers%s, %.1f MB of weights in VRAM\n", (long long)gpu_layers->layers(),
                 (long long)config.num_layers, gpu_layers->runs_head() ? " and the output head" : "",
                 double(gpu_layers->weight_bytes()) / 1e6);
    if (const char* v = std::getenv("TIERLM_GPU_SETUP_REPORT"); v && std::string(v) == "1")
      std::fprintf(stderr, "gpu setup:\n%s", gpu_layers->setup_report().c_str());
  }
  engine::Generator generator(forward, ledger, context);

  engine::GenerationRequest request;
  request.prompt = tokenizer.encode(o.prompt, /*add_special_tokens=*/true);
  request.max_tokens = o.max_tokens;
  request.ignore_stop_tokens = o.ignore_eos;
  request.stop_tokens = config.eos_token_ids;
  for (int32_t id : tokenizer.eos_ids())
    if (std::find(request.stop_tokens.begin(), request.stop_tokens.end(), id) == request.stop_tokens.end())
      request.stop_tokens.push_back(id);
  auto& s = request.sampling;
  s.temperature = o.temperature;
  s.top_k = o.top_k;
  s.top_p = o.top_p;
  s.min_p = o.min_p;
  s.repetition_penalty = o.repetition_penalty;
  if (o.seed) {
    s.seed = *o.seed;
    s.has_seed = true;
  }
  s.validate();

  std::fprintf(stderr, "model %s (%s, %lld layers, %.1f MB of weights), %d threads, prompt %zu tokens\n",
               o.model.c_str(), config.model_type.c_str(), (long long)config.num_layers, double(weights.bytes()) / 1e6,
               pool.size(), request.prompt.size());
  std::fputs(o.prompt.c_str(), stdout);
  tok::StreamDecoder decoder(tokenizer, /*skip_special_tokens=*/true);
  auto stats = generator.generate(request, [&](int32_t token) {
    std::string piece = decoder.step(token);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::string rest = decoder.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "prompt: %lld tokens, %.1f tok/s | generated: %lld tokens, %.1f tok/s | finish: %s | memory: %.1f MB "
               "in ledger\n",
               (long long)stats.prompt_tokens, stats.prefill_tokens_per_second(), (long long)stats.generated_tokens,
               stats.decode_tokens_per_second(), stats.finish_reason.c_str(), double(ledger.peak()) / 1e6);
  if (gpu_layers && config.arch.moe) {
    const gpu::GpuExpertStats e = gpu_layers->expert_stats();
    std::fprintf(stderr,
                 "gpu experts: %llu resident hits, %llu slot hits, %llu copied (%.1f MB), %llu on the CPU, %llu layer "
                 "steps routed on the device; VRAM peak %.1f MB\n",
                 (unsigned long long)e.resident_hits, (unsigned long long)e.slot_hits, (unsigned long long)e.misses,
                 double(e.bytes_copied) / 1e6, (unsigned long long)e.cpu_experts,
                 (unsigned long long)e.device_routed, double(gpu_layers->vram_ledger().peak()) / 1e6);
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt with a Hugging Face model folder");
  cmd->add_option("--model,-m", o->model, "Model folder (config.json, *.safetensors, tokenizer.json) or Hugging Face id ORG/NAME[@REV]")
      ->capture_default_str();
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text")->capture_default_str();
  cmd->add_option("--max-tokens,-n", o->max_tokens, "Tokens to generate")->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass (1: off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--min-p", o->min_p, "Drop tokens below min-p x the top probability")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--repetition-penalty", o->repetition_penalty, "Penalty for repeated tokens (1: off)");
  cmd->add_option("--seed", o->seed, "Random seed (same seed, same output)");
  cmd->add_option("--threads,-t", o->threads, "Worker threads (0: one per physical core)");
  cmd->add_option("--weight-format", o->weight_format, "Convert weights at load: f32, f16, bf16, q8_0, q4");
  cmd->add_option("--context", o->context, "Context length (tokens)")->check(CLI::Range(int64_t(16), int64_t(1) << 22));
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens per forward pass")->check(CLI::Range(1, 8192));
  cmd->add_option("--gpu-layers", o->gpu_layers, "Layers to run on the GPU, from the first (CUDA builds; 0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--mem-budget", o->mem_budget_gib, "Memory budget in GiB for weights+KV+scratch (0: none)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_option("--kv-codec", o->kv_codec, "KV cache codec: f32 (exact), f16, q8, turbo3, turbo4")
      ->check(CLI::IsMember({"f32", "f16", "q8", "turbo3", "turbo4"}))
      ->capture_default_str();
  cmd->add_option("--wisdom", o->wisdom, "Wisdom file with the calibrated plan (default: $XDG_CACHE_HOME/tierlm/wisdom.json)");
  cmd->add_option("--on-missing-wisdom", o->on_missing_wisdom,
                  "Without a plan for this machine and model: calibrate (quick, then store it) or refuse")
      ->check(CLI::IsMember({"calibrate", "refuse"}))
      ->capture_default_str();
  cmd->add_flag("--no-wisdom", o->no_wisdom, "Ignore wisdom: run on explicit flags and defaults only");
  cmd->callback([o, cmd] {
    o->model = resolve_model(o->model);
    run(*o, *cmd);
  });
}

}  // namespace tierlm::cli
