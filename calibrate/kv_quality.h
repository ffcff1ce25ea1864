// calibrate/kv_quality.h — what each lossy KV codec costs a model in quality: its perplexity on a fixed text
// (profiles/text/kv-quality.txt) with each codec against the exact f32 cache, within a time budget. The planner picks
// a turbo codec only where this measured increase is small (planner.cpp, kKvMaxPerplexityIncrease). Owns nothing
// after it returns; never changes the model.
#pragma once

#include <filesystem>
#include <string>

#include "calibrate/model_profile.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::calibrate {

struct KvQualityOptions {
  std::string text_path = std::string(TIERLM_SOURCE_DIR) + "/profiles/text/kv-quality.txt";
  int64_t max_tokens = 1024;  // at most the model's context (256 tokens of code-small gave turbo4 +1.8%, 1,024 +0.8%)
  int64_t min_tokens = 128;   // fewer than this in the time budget: not measured
  double max_seconds = 60;    // all passes together (f32 + each codec); 0: not measured
  int threads = 0;
};

// Fills p.kv_perplexity_increase (f16, q8, turbo4, turbo3 where the model's layers take them) and p.kv_quality_tokens.
// The text is tokenized with the model's tokenizer when the folder has one, else read as bytes (synthetic models).
// Leaves both empty when the budget is too short for min_tokens.
void measure_kv_quality(const model::ModelWeights& weights, const std::filesystem::path& model_dir,
                        tiering::Ledger& ledger, const KvQualityOptions& options, ModelProfile& p);

}  // namespace tierlm::calibrate
