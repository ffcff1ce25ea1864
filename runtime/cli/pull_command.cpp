// `tierlm pull ORG/NAME[@REVISION]` — fetch a model's files from the Hugging Face hub into the standard cache
// (runtime/hub), print the snapshot folder on stdout. run/serve/calibrate/pack do the same implicitly for an id.
#include <cstdio>
#include <memory>
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "runtime/cli/commands.h"
#include "runtime/hub/download_progress.h"
#include "runtime/hub/pull.h"

namespace tierlm::cli {

void add_pull_command(CLI::App& app) {
  struct PullCliOptions {
    std::string id;
    hub::PullOptions pull;
  };
  auto o = std::make_shared<PullCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "pull", "Download a model from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE, HF_HUB_OFFLINE)");
  cmd->add_option("id", o->id, "Hugging Face repo id: ORG/NAME[@REVISION]")->required();
  cmd->add_option("--include", o->pull.filter.include,
                  "Also fetch the repo files matching this glob (repeatable; default: config, tokenizer, chat "
                  "template, generation config, safetensors shards and index)");
  cmd->add_option("--exclude", o->pull.filter.exclude, "Skip the repo files matching this glob (repeatable)");
  cmd->add_option("--parallel", o->pull.parallel, "Files downloaded at once")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->callback([o] {
    const auto id = hub::parse_hub_id(o->id);
    if (!id)
      throw std::invalid_argument("'" + o->id + "' is " +
                                  (std::filesystem::exists(o->id) ? "a local path: it needs no pull"
                                                                  : "not a Hugging Face repo id (ORG/NAME[@REVISION])"));
    const hub::PulledModel pulled = hub::pull(*id, o->pull);
    std::fprintf(stderr, "%s: %s (commit %s, %zu files, %s fetched)\n", id->display().c_str(),
                 pulled.from_cache_only ? "complete in the cache" : "downloaded", pulled.commit.c_str(), pulled.files,
                 hub::human_bytes(double(pulled.bytes_fetched)).c_str());
    std::printf("%s\n", pulled.snapshot_dir.c_str());
  });
}

}  // namespace tierlm::cli
