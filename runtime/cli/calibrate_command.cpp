// `tierlm calibrate` — measure this machine and a model, plan, and store the plan in the wisdom file.
#include <cstdio>
#include <map>
#include <memory>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include "calibrate/calibration.h"
#include "calibrate/report.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/model_setup.h"
#include "runtime/cli/progress.h"

namespace tierlm::cli {

namespace {

struct CalibrateCliOptions {
  std::string model = default_model_dir();
  std::string wisdom;
  std::string prompts = std::string(TIERLM_SOURCE_DIR) + "/profiles/prompts";
  std::string weight_format;
  double budget_gib = 0;
  double gpu_memory_gib = 0;
  int64_t context = 4096;
  int64_t batch = calibrate::kServeBatch;
  bool batch_given = false;
  double trace_seconds = 60;
  bool quick = false;
  bool json = false;
};

void run_calibrate(const CalibrateCliOptions& o) {
  calibrate::CalibrateOptions c;
  c.model_dir = o.model;
  if (!o.wisdom.empty()) c.wisdom_path = o.wisdom;
  c.prompts_dir = o.prompts;
  c.weight_format = o.weight_format;
  c.budget_bytes = uint64_t(o.budget_gib * double(1ull << 30));
  c.gpu_budget_bytes = uint64_t(o.gpu_memory_gib * double(1ull << 30));
  c.context = o.context;
  c.batch = o.batch;
  c.fit_batch = !o.batch_given;
  c.trace_seconds = o.trace_seconds;
  c.quick = o.quick;
  std::map<std::string, std::unique_ptr<ProgressBar>> bars;
  c.progress = [&](const std::string& stage, size_t done, size_t total) {
    auto& bar = bars[stage];
    if (!bar) bar = std::make_unique<ProgressBar>(stage);
    bar->update(done, total);
  };
  const calibrate::WisdomEntry entry = calibrate::calibrate_model(c);
  if (o.json) {
    std::puts(boost::json::serialize(boost::json::object{{"wisdom_path", c.wisdom_path.string()},
                                                         {"device", calibrate::to_json(entry.device)},
                                                         {"model", calibrate::to_json(entry.model)},
                                                         {"plan", calibrate::to_json(entry.plan)}})
                  .c_str());
  } else {
    std::fputs(calibrate::render_entry(entry).c_str(), stdout);
    std::fprintf(stderr, "\nwisdom written to %s (calibration took %.1f s of probes)\n", c.wisdom_path.string().c_str(),
                 entry.device.probe_seconds);
  }
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateCliOptions>();
  CLI::App* cmd = app.add_subcommand("calibrate", "Measure this machine and a model, plan, and store the plan (wisdom)");
  cmd->add_option("--model,-m", o->model, "Model folder or Hugging Face id ORG/NAME[@REV]")->capture_default_str();
  cmd->add_option("--wisdom", o->wisdom, "Wisdom file (default: $XDG_CACHE_HOME/tierlm/wisdom.json)");
  cmd->add_option("--prompts", o->prompts, "Folder of *.txt prompts for router traces")->capture_default_str();
  cmd->add_option("--weight-format", o->weight_format, "Weight format the model will run in (as for run)");
  cmd->add_option("--budget", o->budget_gib, "Memory budget in GiB (0: 85% of usable memory)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpu-memory", o->gpu_memory_gib,
                  "VRAM the plan may use, in GiB (0: free device memory minus 1 GiB): the GPU layers, device KV and "
                  "the experts kept in VRAM; the other experts run on the CPU or are copied in")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--context", o->context, "Target context (tokens per sequence)")->check(CLI::Range(int64_t(16), int64_t(1) << 22));
  cmd->add_option("--batch", o->batch,
                  "Target batch (sequences decoded together; serve's default --max-batch). Not given: the plan may "
                  "lower it until its KV fits")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--trace-seconds", o->trace_seconds, "Time bound for router traces")->check(CLI::Range(0.5, 3600.0));
  cmd->add_flag("--quick", o->quick, "Short probes (under 20 s in all)");
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->callback([o, cmd] {
    o->model = resolve_model(o->model);
    o->batch_given = cmd->count("--batch") > 0;
    run_calibrate(*o);
  });
}

}  // namespace tierlm::cli
