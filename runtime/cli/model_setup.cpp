#include "runtime/cli/model_setup.h"

#include "runtime/cli/progress.h"
#include "runtime/hub/pull.h"

namespace tierlm::cli {

std::string default_model_dir() { return std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny"; }

std::string resolve_model(const std::string& model) { return hub::resolve_model_argument(model); }

LoadedModel load_for_cli(const std::string& model_dir, double mem_budget_gib, const std::string& weight_format,
                         model::LoadOptions load) {
  auto ledger = std::make_unique<tiering::Ledger>(mem_budget_gib > 0 ? uint64_t(mem_budget_gib * double(1ull << 30))
                                                                     : tiering::Ledger::kUnlimited);
  tok::Tokenizer tokenizer = tok::Tokenizer::load(model_dir);
  load.ledger = ledger.get();
  if (!weight_format.empty()) load.weight_format = kernels::parse_format(weight_format);
  ProgressBar bar("loading " + model_dir);
  load.progress = [&](size_t done, size_t total) { bar.update(done, total); };
  model::ModelWeights weights = model::load_model(model_dir, load);
  return LoadedModel{std::move(ledger), std::move(tokenizer), std::move(weights)};
}

}  // namespace tierlm::cli
