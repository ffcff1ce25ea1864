// runtime/cli/model_setup.h — what `run` and `serve` both need before their engine: the ledger sized by
// --mem-budget, the tokenizer, and the weights loaded with a progress bar. Members are declared so that the weights
// (charged to the ledger) are destroyed before the ledger.
#pragma once

#include <memory>
#include <string>

#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tiering/ledger.h"

namespace tierlm::cli {

struct LoadedModel {
  std::unique_ptr<tiering::Ledger> ledger;
  tok::Tokenizer tokenizer;
  model::ModelWeights weights;
};

// The embedded default model (profiles/models/tierlm-tiny in the source tree), used when --model is not given.
std::string default_model_dir();

// --model's argument as a folder: a local path as given (an existing path always wins); a Hugging Face repo id,
// ORG/NAME[@REVISION], as its snapshot folder in the hub cache, fetched first when files are missing (runtime/hub).
std::string resolve_model(const std::string& model);

// mem_budget_gib <= 0: unlimited. weight_format empty: as stored. `load` carries the plan's settings; its ledger and
// progress fields are filled here.
LoadedModel load_for_cli(const std::string& model_dir, double mem_budget_gib, const std::string& weight_format,
                         model::LoadOptions load);

}  // namespace tierlm::cli
