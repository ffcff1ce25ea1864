// `tierlm wisdom show` — the stored plan(s) for a person (tables, memory bars) or, with --json, for machines.
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include "calibrate/probes.h"
#include "calibrate/report.h"
#include "calibrate/wisdom.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/model_setup.h"

namespace tierlm::cli {

namespace {

struct WisdomCliOptions {
  std::string wisdom;
  std::string model;  // empty: every entry
  std::string weight_format;
  bool json = false;
};

void show(const WisdomCliOptions& o) {
  const std::filesystem::path path = o.wisdom.empty() ? calibrate::default_wisdom_path() : std::filesystem::path(o.wisdom);
  // A corrupt file is an error naming it and the command that rebuilds it; show never changes the file.
  const calibrate::Wisdom wisdom = calibrate::load_wisdom(path, o.model);
  std::vector<const calibrate::WisdomEntry*> entries;
  std::string status;
  if (!o.model.empty()) {
    const auto device = calibrate::probe_device_identity(o.model);
    const auto lookup = calibrate::find_wisdom(wisdom, device, o.model,
                                               calibrate::model_fingerprint(o.model, o.weight_format), path);
    if (lookup.status != calibrate::WisdomLookup::Status::found) {
      if (!lookup.entry) throw calibrate::WisdomError(lookup.message);
      status = lookup.message;
    }
    entries.push_back(lookup.entry);
  } else {
    for (auto& e : wisdom.entries) entries.push_back(&e);
    if (entries.empty()) throw calibrate::WisdomError("no wisdom in " + path.string() + "; run `" + calibrate::recalibrate_command(path) + "`");
  }
  if (o.json) {
    boost::json::array out;
    for (auto* e : entries)
      out.push_back(boost::json::object{{"created_at", e->created_at},
                                        {"device", calibrate::to_json(e->device)},
                                        {"model", calibrate::to_json(e->model)},
                                        {"plan", calibrate::to_json(e->plan)}});
    boost::json::object doc{{"wisdom_path", path.string()}, {"entries", out}};
    if (!status.empty()) doc["stale"] = status;
    std::puts(boost::json::serialize(doc).c_str());
    return;
  }
  std::printf("wisdom file %s\n\n", path.string().c_str());
  for (auto* e : entries) std::fputs((calibrate::render_entry(*e) + "\n").c_str(), stdout);
  if (!status.empty()) std::fprintf(stderr, "warning: %s\n", status.c_str());
}

}  // namespace

void add_wisdom_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("wisdom", "Inspect the stored calibration plans");
  cmd->require_subcommand(1);
  auto o = std::make_shared<WisdomCliOptions>();
  CLI::App* show_cmd = cmd->add_subcommand("show", "Render the plan for a person (or --json for machines)");
  show_cmd->add_option("--wisdom", o->wisdom, "Wisdom file (default: $XDG_CACHE_HOME/tierlm/wisdom.json)");
  show_cmd->add_option("--model,-m", o->model, "Only the entry for this model folder or hub id (checked against this machine)");
  show_cmd->add_option("--weight-format", o->weight_format, "Weight format the model was calibrated for");
  show_cmd->add_flag("--json", o->json, "Machine-readable JSON");
  show_cmd->callback([o] {
    o->model = resolve_model(o->model);
    show(*o);
  });
}

}  // namespace tierlm::cli
