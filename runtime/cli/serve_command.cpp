// `tierlm serve` — the OpenAI-compatible HTTP server: loads a model folder, puts the plan's GPU layers on the device
// (or --gpu-layers), starts the scheduler (engine thread) and the Beast server (I/O threads), and runs until
// SIGINT/SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calibrate/apply_plan.h"
#include "calibrate/calibration.h"
#include "calibrate/serving_fit.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/model_setup.h"
#include "runtime/engine/scheduler.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/kv/codec.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/chat_prompt.h"
#include "server/expert_tier_counters.h"
#include "server/gpu_layers_counters.h"
#include "server/http_server.h"
#include "server/service.h"
#include "server/telemetry.h"

namespace tierlm::cli {

namespace {

struct ServeOptions {
  std::string model = default_model_dir();
  std::string served_model_name;
  std::string chat_template;
  std::string weight_format;
  server::HttpServerOptions http;
  engine::SchedulerOptions scheduler;
  double mem_budget_gib = 0;
  std::string kv_codec = "f32";
  int64_t gpu_layers = 0;     // layers [0, n) on the GPU (CUDA builds); more than the model has: all and the head
  gpu::GpuOptions gpu_plan;   // the plan's VRAM expert set, device KV codec and VRAM budget, when it chose gpu_layers
  std::string wisdom;                           // wisdom file ("" : the XDG default)
  std::string on_missing_wisdom = "calibrate";  // or "refuse"
  bool no_wisdom = false;
  int64_t expert_prefetch = -1;  // MoE lookahead prefetch reads in flight (0: off; -1: the plan's)
  int64_t expert_lookahead = 1;  // sparse layers ahead the lookahead guesses
  std::string expert_conversion = "worker";  // where a landed expert read is converted: "worker" or "inline"
};

// As `tierlm run`: the plan for this machine and model fills every setting not given on the command line, and
// becomes the active plan that GET /wisdom publishes. The plan was sized for a batch and context (serve's defaults
// when calibrate was not told otherwise), and serve defaults to them; a --max-batch, --context, --kv-codec or
// --mem-budget it does not cover re-fits it (calibrate/serving_fit.h): the expert cache gives way to the KV, said on
// stderr, or serve refuses with what fits.
void apply_wisdom(ServeOptions& o, const CLI::App& cmd, model::LoadOptions& load) {
  if (o.no_wisdom) return;
  const bool batch_given = cmd.count("--max-batch") > 0, context_given = cmd.count("--context") > 0;
  calibrate::CalibrateOptions c;
  c.model_dir = o.model;
  if (!o.wisdom.empty()) c.wisdom_path = o.wisdom;
  c.weight_format = o.weight_format;
  if (context_given && o.scheduler.context > 0) c.context = o.scheduler.context;
  if (batch_given) c.batch = o.scheduler.max_batch;
  c.fit_batch = !batch_given;
  const calibrate::ResolvedPlan resolved = calibrate::resolve_plan(c, calibrate::parse_missing_wisdom(o.on_missing_wisdom));
  calibrate::WisdomEntry entry = resolved.entry;
  const int64_t max_context = std::max<int64_t>(entry.model.max_context, 1);
  calibrate::ServingRequest request;
  if (batch_given) request.batch = o.scheduler.max_batch;
  if (context_given)  // 0 or more than the model holds: the model's maximum
    request.context = o.scheduler.context > 0 ? std::min(o.scheduler.context, max_context) : max_context;
  if (cmd.count("--kv-codec")) request.kv_codec = o.kv_codec;
  if (cmd.count("--threads") && o.scheduler.threads > 0) request.threads = o.scheduler.threads;
  const bool unlimited = cmd.count("--mem-budget") && o.mem_budget_gib <= 0;
  if (cmd.count("--mem-budget") && !unlimited) request.budget_bytes = uint64_t(o.mem_budget_gib * double(1ull << 30));
  if (!unlimited) {
    calibrate::ServingFit fit = calibrate::fit_serving(entry, request);  // ServingFitError: refuse with what fits
    if (fit.refitted) spdlog::warn("[server] {}", fit.note);
    entry.plan = std::move(fit.plan);
  }
  const calibrate::Plan& plan = entry.plan;
  if (!batch_given) o.scheduler.max_batch = plan.batch;
  if (!context_given) o.scheduler.context = std::min(plan.context, max_context);
  if (!cmd.count("--threads")) o.scheduler.threads = plan.threads;
  if (!cmd.count("--prefill-size")) o.scheduler.prefill_size = plan.prefill_chunk;
  if (!cmd.count("--mem-budget")) o.mem_budget_gib = double(plan.budget_bytes) / double(1ull << 30);
  if (!cmd.count("--kv-codec")) o.kv_codec = plan.kv_codec;
  if (!cmd.count("--gpu-layers")) {
    o.gpu_layers = plan.gpu_layers;
    o.gpu_plan = calibrate::gpu_options(plan);
  }
  if (entry.model.moe()) load.experts = calibrate::expert_tier_options(plan);
  calibrate::set_active_plan(entry);
  spdlog::info("[server] wisdom plan {}/{}: {} threads, prefill {}, KV {}, budget {:.2f} GiB, {} GPU layers, max batch "
               "{}, context {}",
               plan.device_fingerprint, plan.model_fingerprint, o.scheduler.threads, o.scheduler.prefill_size,
               o.kv_codec, o.mem_budget_gib, o.gpu_layers, o.scheduler.max_batch, o.scheduler.context);
}

// Layers [0, o.gpu_layers) on the GPU, keeping the device KV of every slot (max_sequences = max_batch: a step of
// max_batch sequences fits). Throws with the reason when there is no usable GPU or the VRAM budget cannot hold the
// layers; how much KV fits is GpuLayers' own accounting (its VRAM ledger), not estimated here.
std::shared_ptr<gpu::GpuLayers> make_gpu_layers(const ServeOptions& o, const model::ModelWeights& weights,
                                                const engine::SchedulerOptions& sched, tiering::Ledger& ledger) {
  gpu::GpuOptions options = o.gpu_plan;
  options.layers = o.gpu_layers;
  options.host_ledger = &ledger;  // pinned staging counts against the host budget and shows in /health
  options.max_sequences = sched.max_batch;
  auto gpu = std::make_shared<gpu::GpuLayers>(weights, options, engine::Scheduler::step_rows(sched), sched.context);
  const tiering::Ledger& vram = gpu->vram_ledger();
  spdlog::info("[server] gpu: {} of {} layers{}, {:.1f} MB of weights in VRAM; device KV for {} slots of {} positions "
               "({}); VRAM ledger {:.1f} MB used of {}",
               gpu->layers(), weights.config.num_layers, gpu->runs_head() ? " and the output head" : "",
               double(gpu->weight_bytes()) / 1e6, sched.max_batch, sched.context,
               options.kv_codec == gpu::GpuKvCodec::q8 ? "q8" : options.kv_codec == gpu::GpuKvCodec::f32 ? "f32" : "f16",
               double(vram.used()) / 1e6,
               vram.budget() == tiering::Ledger::kUnlimited ? std::string("no budget")
                                                            : fmt::format("{:.1f} MB", double(vram.budget()) / 1e6));
  return gpu;
}

void serve(ServeOptions o, const CLI::App& cmd) {
  // Block the stop signals before any thread starts, so every thread inherits the mask and only sigwait sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  model::LoadOptions load;
  apply_wisdom(o, cmd, load);
  // A codec the user named holds on the GPU layers too (f32: the exact configuration), or is refused there by name.
  if (cmd.count("--kv-codec") && o.gpu_layers > 0) calibrate::apply_kv_codec_to_gpu(o.kv_codec, o.gpu_plan);
  // Each layer looked ahead holds its own guesses: the plan's limit (one layer's top-k) per layer, unless given.
  if (o.expert_prefetch >= 0)
    load.experts.cache.prefetch_limit = o.expert_prefetch;
  else
    load.experts.cache.prefetch_limit *= o.expert_lookahead;
  load.experts.cache.lookahead_layers = o.expert_lookahead;
  load.experts.cache.convert_on_worker = o.expert_conversion == "worker";
  kv::set_default_codec(kv::parse_codec(o.kv_codec));  // every slot's KV cache takes the process default
  LoadedModel loaded = load_for_cli(o.model, o.mem_budget_gib, o.weight_format, load);
  tiering::Ledger& ledger = *loaded.ledger;
  const tok::Tokenizer& tokenizer = loaded.tokenizer;
  model::ModelWeights& weights = loaded.weights;

  const std::filesystem::path dir(o.model);
  const std::string model_id = !o.served_model_name.empty() ? o.served_model_name
                               : dir.filename().empty()      ? dir.parent_path().filename().string()
                                                             : dir.filename().string();
  auto prompt = server::ChatPrompt::load(
      dir, o.chat_template.empty() ? std::nullopt : std::optional<std::filesystem::path>(o.chat_template), tokenizer);

  // A copy made after the weights: the GPU layers it holds (and the scheduler's copy) go before the weights do.
  engine::SchedulerOptions sched = o.scheduler;
  if (sched.context <= 0 || sched.context > weights.config.max_position_embeddings)
    sched.context = weights.config.max_position_embeddings;
  std::shared_ptr<server::GpuLayersCounters> gpu_counters;
  if (o.gpu_layers > 0) {
    sched.gpu = make_gpu_layers(o, weights, sched, ledger);
    gpu_counters = std::make_shared<server::GpuLayersCounters>(sched.gpu, weights.config.num_layers);
  }
  std::shared_ptr<server::ExpertTierCounters> tier_counters;
  if (weights.experts) tier_counters = std::make_shared<server::ExpertTierCounters>(weights.experts);
  // The engine thread owns the expert tier and the GPU layers: their counters are copied there after each step.
  if (tier_counters || gpu_counters)
    sched.after_step = [tier_counters, gpu_counters] {
      if (tier_counters) tier_counters->refresh();
      if (gpu_counters) gpu_counters->refresh();
    };
  const int64_t gpu_layers = sched.gpu ? sched.gpu->layers() : 0;  // read before the engine thread owns them
  std::optional<engine::Scheduler> scheduler_slot;
  try {
    scheduler_slot.emplace(weights, ledger, sched);
  } catch (const tiering::LedgerError& e) {
    // Not a bare ledger error: what the engine asked for, what was in use, and the flags that change it.
    throw std::runtime_error(fmt::format(
        "serve: {} KV slots of {} positions ({}) and the engine's scratch do not fit the {:.2f} GiB memory budget with "
        "{:.2f} GiB already in use by the weights and the expert tier ({}); lower --max-batch or --context, choose a "
        "smaller --kv-codec, or raise --mem-budget",
        sched.max_batch, sched.context, o.kv_codec, double(ledger.budget()) / double(1ull << 30),
        double(ledger.used()) / double(1ull << 30), e.what()));
  }
  engine::Scheduler& scheduler = *scheduler_slot;

  server::ServerInfo info;
  info.model_id = model_id;
  info.model_path = o.model;
  info.architecture = weights.config.model_type;
  info.weight_bytes = weights.bytes();
  info.chat_template = prompt.description();
  info.threads = sched.threads;
  server::Telemetry telemetry(info, ledger, scheduler);
  if (tier_counters) telemetry.set_tiering(tier_counters);
  if (gpu_counters) telemetry.set_gpu(gpu_counters);
  server::Service service(model_id, tokenizer, std::move(prompt), scheduler, telemetry);
  server::HttpServer http(service, o.http);
  http.start();
  // A status line, not product output: stderr, like every log line (scripts read the port from it).
  std::fprintf(stderr, "tierlm serve: model %s listening on http://%s:%u (context %lld, max batch %lld, prefill %lld, "
               "gpu layers %lld)\n",
               model_id.c_str(), o.http.host.c_str(), unsigned(http.port()), static_cast<long long>(sched.context),
               static_cast<long long>(sched.max_batch), static_cast<long long>(sched.prefill_size),
               static_cast<long long>(gpu_layers));
  std::fflush(stderr);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("[server] signal {}: stopping", signal_number);
  http.stop();
  scheduler.stop();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat/completions, SSE, /health, /metrics)");
  cmd->add_option("--model,-m", o->model, "Model folder (config.json, *.safetensors, tokenizer.json) or Hugging Face id ORG/NAME[@REV]")
      ->capture_default_str();
  cmd->add_option("--host", o->http.host, "Address to bind (default loopback only)");
  cmd->add_option("--port", o->http.port, "TCP port (0: any free port)");
  cmd->add_option("--api-key", o->http.api_key, "Require 'Authorization: Bearer KEY' (or TIERLM_API_KEY)")
      ->envname("TIERLM_API_KEY");
  cmd->add_option("--context", o->scheduler.context, "Positions per sequence (0: the model's maximum)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  cmd->add_option("--max-batch", o->scheduler.max_batch, "Sequences decoded together (KV slots)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--prefill-size", o->scheduler.prefill_size, "Prompt tokens fed per engine step (chunked prefill)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--queue-limit", o->scheduler.queue_limit, "Requests waiting for a slot before 429")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--threads", o->scheduler.threads, "Compute threads (0: one per physical core)");
  cmd->add_option("--io-threads", o->http.io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  cmd->add_option("--max-body-bytes", o->http.max_body_bytes, "Largest request body accepted (else 413)");
  cmd->add_option("--read-timeout", o->http.read_timeout_seconds, "Seconds to read a request / keep-alive idle");
  cmd->add_option("--allowed-hosts", o->http.allowed_hosts,
                  "Host header names answered besides loopback and the bound address (comma list; '*': any, which "
                  "turns off the DNS-rebinding check)");
  cmd->add_option("--cors-origin", o->http.cors_origins,
                  "Origin allowed to call the API from a browser (CORS); repeatable or a comma list (default: none)");
  cmd->add_option("--max-connections", o->http.max_connections, "Open connections; more are answered 503 and closed")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--request-timeout", o->http.request_timeout_seconds,
                  "Seconds a generation may run from its request; then it ends with finish_reason \"length\" (503 when "
                  "nothing was generated yet); 0: no limit")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file overriding the model's");
  cmd->add_option("--served-model-name", o->served_model_name, "Model id clients use (default: the folder name)");
  cmd->add_option("--weight-format", o->weight_format, "Convert dense weights at load (f16, q8_0, q4, ...)");
  cmd->add_option("--mem-budget,--mem-budget-gib", o->mem_budget_gib, "Ledger budget in GiB (0: unlimited)");
  cmd->add_option("--kv-codec", o->kv_codec, "KV cache codec: f32, f16, q8, turbo3, turbo4");
  cmd->add_option("--gpu-layers", o->gpu_layers,
                  "Layers to run on the GPU, from the first; the output head too when all are (CUDA builds; 0: none; "
                  "default: the wisdom plan's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--wisdom", o->wisdom, "Wisdom file with the calibrated plan (default: $XDG_CACHE_HOME/tierlm/wisdom.json)");
  cmd->add_option("--on-missing-wisdom", o->on_missing_wisdom,
                  "Without a plan for this machine and model: calibrate (quick, then store it) or refuse")
      ->check(CLI::IsMember({"calibrate", "refuse"}));
  cmd->add_flag("--no-wisdom", o->no_wisdom, "Ignore wisdom: run on explicit flags and defaults only");
  cmd->add_option("--expert-prefetch", o->expert_prefetch,
                  "MoE: next-layer expert reads started ahead, predicted by that layer's router (0: off; default: the "
                  "plan's); guesses are read only while their measured precision pays for the wasted ones "
                  "(/health tiering.prefetch_skipped)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--expert-lookahead", o->expert_lookahead,
                  "MoE: sparse layers ahead whose experts decode guesses and starts reading (default 1; more keeps a "
                  "slow disk busy at more wasted reads; the prefetch limit grows with it unless --expert-prefetch)")
      ->check(CLI::Range(int64_t(1), int64_t(8)));
  cmd->add_option("--expert-conversion", o->expert_conversion,
                  "MoE: where a streamed expert's landed read is converted to the slot's layout: on the cache's "
                  "worker thread (default) or inline on the forward thread (for comparison)")
      ->check(CLI::IsMember({"worker", "inline"}));
  cmd->callback([o, cmd] {
    const std::string given = o->model;
    o->model = resolve_model(given);
    if (o->served_model_name.empty() && o->model != given) o->served_model_name = given;  // a hub id names itself
    serve(*o, *cmd);
  });
}

}  // namespace tierlm::cli
