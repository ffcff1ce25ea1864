// `tierlm bench profile --model DIR` — the context x configuration matrix: for each context (512 / 40K / 100K by
// default, as far as the model allows) and each configuration (in RAM: every expert resident, f16 KV; experts
// streamed: a budget that keeps a quarter of the experts in memory and reads the rest from disk through the cache;
// turbo KV: in RAM with turbo3 KV; streamed + turbo KV), the planner (calibrate/fit.h, the same as `tierlm fit`)
// makes the plan at that budget and codec, and a child process runs it (so each cell's peak RSS is its own): the
// prompt fills the context, then greedy decode. Prefill and decode tok/s, time to first token, expert hit rate,
// peak RSS and ledger peak bytes by account are printed as a table and written as Markdown, JSON and an SVG chart
// (runtime/cli/profile_report.h).
// Never: run a cell in the parent (one process's high-water mark would cover them all).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calibrate/apply_plan.h"
#include "calibrate/fit.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/fit_shape.h"
#include "runtime/cli/model_setup.h"
#include "runtime/cli/profile_report.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/generator.h"
#include "runtime/kv/codec.h"
#include "runtime/model/model.h"
#include "server/process_stats.h"

namespace tierlm::cli {

namespace {

namespace bj = boost::json;
namespace fs = std::filesystem;

struct ProfileOptions {
  std::string model;
  std::vector<int64_t> contexts = {512, 40960, 102400};
  std::vector<std::string> configurations = {"in_ram", "streamed", "turbo_kv", "streamed_turbo_kv"};
  int64_t decode_tokens = 16;
  int threads = 0;               // 0: the plan's
  double resident_share = 0.25;  // of the experts, in the streamed configurations
  std::string device;            // a device profile JSON instead of this machine's rates (fit_device)
  std::string out_dir = ".";
  std::string run_plan;          // internal: run one cell's plan (a JSON file) and print its measurement
};

uint64_t peak_rss_bytes() {
  return server::peak_resident_set_bytes().value_or(0);
}

// The child: one plan, measured.
void run_cell(const ProfileOptions& o) {
  std::ifstream in(o.run_plan);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const calibrate::Plan plan = calibrate::plan_from_json(bj::parse(text));
  ProfileCell cell;
  tiering::Ledger ledger(plan.budget_bytes);
  model::LoadOptions lo;
  lo.ledger = &ledger;
  lo.experts = calibrate::expert_tier_options(plan);
  model::ModelWeights w = model::load_model(o.model, lo);
  kernels::ThreadPool pool(o.threads > 0 ? o.threads : plan.threads);
  kv::set_default_codec(kv::parse_codec(plan.kv_codec));
  engine::Forward forward(w, pool, ledger, plan.prefill_chunk, plan.context);
  engine::Generator generator(forward, ledger, plan.context);
  engine::GenerationRequest request;
  const int64_t prompt = std::max<int64_t>(1, plan.context - o.decode_tokens - 1);
  for (int64_t i = 0; i < prompt; ++i) request.prompt.push_back(int32_t((i * 7919 + 13) % w.config.vocab_size));
  request.max_tokens = o.decode_tokens;
  request.ignore_stop_tokens = true;
  const auto stats = generator.generate(request, [](int32_t) { return true; });
  cell.ok = true;
  cell.prompt_tokens = stats.prompt_tokens;
  cell.decoded_tokens = stats.generated_tokens;
  cell.prefill_tokens_per_second = stats.prefill_tokens_per_second();
  cell.time_to_first_token_seconds = stats.prefill_seconds;
  // generated_tokens counts the first sampled token, which needs no extra forward (as `tierlm bench` counts).
  cell.decode_tokens_per_second =
      stats.decode_seconds > 0 ? double(stats.generated_tokens - 1) / stats.decode_seconds : 0;
  if (w.experts) {
    const auto t = w.experts->telemetry();
    cell.expert_hit_rate = t.hit_rate();
    cell.expert_bytes_read = t.bytes_read;
  }
  cell.peak_rss_bytes = peak_rss_bytes();
  for (auto& a : ledger.snapshot()) cell.ledger_peak[a.name] = a.peak_bytes;
  std::puts(bj::serialize(to_json(cell)).c_str());
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The smallest budget (to 1 MiB) at which `ok` holds for the planner's answer; ok must be monotone in the budget.
uint64_t smallest_budget(const calibrate::FitModelShape& shape, const calibrate::DeviceProfile& device,
                         calibrate::FitRequest request, uint64_t high,
                         const std::function<bool(const calibrate::FitAnswer&)>& ok) {
  uint64_t low = 1 << 20;
  while (high - low > (1u << 20)) {
    request.budget_bytes = low + (high - low) / 2;
    (ok(calibrate::fit_model(shape, device, request)) ? high : low) = request.budget_bytes;
  }
  return high;
}

void profile(const ProfileOptions& given) {
  ProfileOptions o = given;
  if (!o.run_plan.empty()) {
    run_cell(o);
    return;
  }
  o.model = resolve_model(o.model);
  const calibrate::FitModelShape shape = read_fit_shape(o.model);
  std::string device_source;
  const calibrate::DeviceProfile device = fit_device(o.device, device_source, o.model);
  ProfileReport report;
  calibrate::FitRequest base;
  base.largest_context = false;
  base.context = 512;
  const calibrate::FitAnswer first = calibrate::fit_model(shape, device, base);
  if (!first.supported) throw std::runtime_error(o.model + ": " + first.reason);
  const auto& m = first.profile;
  report.model = fmt::format("model {}: {}, {} layers, {}{}; {} decoded tokens per cell", o.model, first.model_type,
                             m.layers, kernels::format_name(first.weight_format),
                             m.moe() ? fmt::format(", {} x {} experts top-{} ({})", m.moe_layers, m.experts, m.top_k,
                                                   kernels::format_name(first.expert_format))
                                     : std::string(),
                             o.decode_tokens);
  report.device = "rates for the plans: " + device_source;
  const fs::path out = o.out_dir;
  fs::create_directories(out);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (int64_t context : o.contexts) {
    if (context > m.max_context) {
      spdlog::warn("profile: context {} is beyond the model's {}; left out", context, m.max_context);
      continue;
    }
    for (const auto& configuration : o.configurations) {
      ProfileCell cell;
      cell.context = context;
      cell.configuration = configuration;
      calibrate::FitRequest request = base;
      request.context = context;
      request.kv_codec = configuration.find("turbo") != std::string::npos ? "turbo3" : "f16";
      const bool streamed = configuration.rfind("streamed", 0) == 0;
      // Budgets from the planner itself: the smallest that holds every expert (in RAM), or the smallest plan plus
      // resident_share of the experts (streamed).
      if (streamed && !m.moe()) {
        cell.error = "a dense model has no experts to stream";
        report.cells.push_back(cell);
        continue;
      }
      const uint64_t all = m.dense_bytes() + m.total_expert_bytes() +
                           2 * calibrate::kv_cache_bytes(m, *request.kv_codec, context, 1) + (uint64_t(1) << 30);
      auto fits = [](const calibrate::FitAnswer& a) { return a.plan.has_value(); };
      auto in_ram = [](const calibrate::FitAnswer& a) { return a.plan && a.streamed_expert_fraction == 0; };
      request.budget_bytes = m.moe() && streamed
                                 ? smallest_budget(shape, device, request, all, fits) +
                                       uint64_t(o.resident_share * double(m.total_expert_bytes()))
                                 : smallest_budget(shape, device, request, all, m.moe() ? in_ram : fits) + (16u << 20);
      const calibrate::FitAnswer a = calibrate::fit_model(shape, device, request);
      if (!a.plan) {
        cell.error = a.reason;
        report.cells.push_back(cell);
        continue;
      }
      const fs::path plan_file = out / fmt::format(".profile-plan-{}-{}.json", context, configuration);
      std::ofstream(plan_file) << bj::serialize(calibrate::to_json(*a.plan));
      const std::string command =
          fmt::format("{} bench profile --model {} --run-plan {} --decode-tokens {} --threads {}", shell_quoted(self),
                      shell_quoted(o.model), shell_quoted(plan_file.string()), o.decode_tokens, o.threads);
      spdlog::info("profile: context {} {}: budget {:.1f} MiB, KV {}, {} resident experts, {} slots", context,
                   configuration, double(a.plan->budget_bytes) / double(1 << 20), a.plan->kv_codec,
                   a.plan->resident_count(), a.plan->cache_slots);
      std::string output;
      if (FILE* child = popen(command.c_str(), "r")) {
        char buffer[4096];
        while (size_t n = fread(buffer, 1, sizeof buffer, child)) output.append(buffer, n);
        const int status = pclose(child);
        if (status != 0) cell.error = fmt::format("the cell's process exited with status {}", status);
      }
      fs::remove(plan_file);
      if (cell.error.empty()) {
        try {
          cell = profile_cell_from_json(bj::parse(output));
        } catch (const std::exception& e) {
          cell.error = std::string("unreadable measurement: ") + e.what();
        }
      }
      cell.context = context;
      cell.configuration = configuration;
      cell.kv_codec = a.plan->kv_codec;
      cell.budget_bytes = a.plan->budget_bytes;
      cell.resident_experts = a.plan->resident_count();
      cell.cache_slots = a.plan->cache_slots;
      cell.streamed_expert_fraction = a.streamed_expert_fraction;
      cell.predicted_decode = a.plan->prediction.decode_tokens_per_second;
      cell.predicted_prefill = a.plan->prediction.prefill_tokens_per_second;
      report.cells.push_back(cell);
    }
  }
  const std::string table = profile_table(report);
  std::fputs(table.c_str(), stdout);
  std::ofstream(out / "profile.md") << profile_markdown(report);
  std::ofstream(out / "profile.json") << bj::serialize(profile_json(report)) << "\n";
  std::ofstream(out / "profile.svg") << profile_svg(report);
  std::fprintf(stderr, "profile: wrote %s, %s and %s\n", (out / "profile.md").c_str(), (out / "profile.json").c_str(),
               (out / "profile.svg").c_str());
}

}  // namespace

void add_bench_profile_command(CLI::App& bench) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* cmd = bench.add_subcommand("profile", "Context x configuration matrix (in RAM / experts streamed / turbo "
                                                  "KV / both): tok/s, TTFT, peak RSS, ledger by account");
  cmd->add_option("--model,-m", o->model, "Model folder or Hugging Face id ORG/NAME[@REV]")->required();
  cmd->add_option("--contexts", o->contexts, "Context lengths (as far as the model allows)")
      ->delimiter(',')->check(CLI::Range(int64_t(32), int64_t(1) << 22));
  cmd->add_option("--configurations", o->configurations, "Any of in_ram, streamed, turbo_kv, streamed_turbo_kv")
      ->delimiter(',')->check(CLI::IsMember({"in_ram", "streamed", "turbo_kv", "streamed_turbo_kv"}));
  cmd->add_option("--decode-tokens", o->decode_tokens, "Tokens decoded per cell")->check(CLI::Range(2, 4096));
  cmd->add_option("--threads", o->threads, "Worker threads (0: the plan's)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--resident-share", o->resident_share, "Share of the experts kept in memory when streamed")
      ->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--device", o->device, "A device profile JSON for the plans instead of this machine's rates");
  cmd->add_option("--out", o->out_dir, "Folder for profile.md, profile.json and profile.svg");
  cmd->add_option("--run-plan", o->run_plan, "Internal: measure one cell's plan and print it as JSON")->group("");
  cmd->callback([o] { profile(*o); });
}

}  // namespace tierlm::cli
