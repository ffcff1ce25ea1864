// calibrate/serving_fit.h — a stored plan fitted to the serving configuration a command will really run: the batch
// (KV slots), context, KV codec and memory budget it asks for. When the plan's own batch and context cover the
// request and its budget is not cut, the plan stands. Otherwise the planner runs again on the stored device and
// model profiles, with the plan's threads and GPU layers and its KV codec (a smaller one only when that one cannot
// fit), so the extra KV comes out of the expert cache (resident experts, then slots) and the note says what shrank.
// When even the minimum expert cache leaves no room, ServingFitError says what was asked, what fits, and the flag to
// change.
// Never: load a model or touch an engine; it is arithmetic on profiles.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "calibrate/planner.h"
#include "calibrate/wisdom.h"

namespace tierlm::calibrate {

class ServingFitError : public PlanError {
 public:
  using PlanError::PlanError;
};

struct ServingRequest {
  int64_t batch = 0;       // sequences decoded together (0: the plan's)
  int64_t context = 0;     // positions per sequence (0: the plan's)
  std::optional<std::string> kv_codec;  // given on the command line
  uint64_t budget_bytes = 0;            // given on the command line (0: the plan's)
  int threads = 0;                      // given on the command line (0: the plan's); each is a MoE prefill lane
  // The flags that set batch, context and budget, for messages (serve: --max-batch, --context, --mem-budget).
  std::string batch_flag = "--max-batch", context_flag = "--context", budget_flag = "--mem-budget";
};

struct ServingFit {
  Plan plan;              // what to run: the stored plan, or the plan re-fitted to the request
  bool refitted = false;
  std::string note;       // when refitted: the asked configuration, the KV it needs, what the expert cache gave up
};

ServingFit fit_serving(const WisdomEntry& entry, const ServingRequest& request);

}  // namespace tierlm::calibrate
