// calibrate/calibration.h — the calibration workflow the CLI and the server share: measure (device + model), plan,
// store in the wisdom file; and, for `run`/`serve`, find the plan that fits this machine and model or, per flag,
// calibrate quickly or refuse with a hint. Also the process's active plan, published by the server at GET /wisdom.
// Never: apply a plan to the engine itself (calibrate/apply_plan.h maps it onto the runtime's option structs).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <boost/json/value.hpp>

#include "calibrate/wisdom.h"

namespace tierlm::calibrate {

using Progress = std::function<void(const std::string& stage, size_t done, size_t total)>;

// The batch a plan is sized for unless one is asked: `serve`'s default --max-batch, so the plan holds the KV of the
// configuration serve runs at defaults (serve then defaults to the plan's batch and context).
inline constexpr int64_t kServeBatch = 8;

struct CalibrateOptions {
  std::filesystem::path model_dir;
  std::filesystem::path wisdom_path = default_wisdom_path();
  bool quick = false;
  uint64_t budget_bytes = 0;  // 0: planner default
  uint64_t gpu_budget_bytes = 0;  // VRAM the plan may use at most (0: free device memory - 1 GiB)
  int64_t context = 4096;
  int64_t batch = kServeBatch;
  bool fit_batch = false;     // batch is the default, not asked for: the planner may lower it to fit (PlanRequest)
  std::string weight_format;  // "" : as stored
  std::string prompts_dir = std::string(TIERLM_SOURCE_DIR) + "/profiles/prompts";
  double trace_seconds = 60;  // quick: at most 5
  Progress progress;
};

// Probes the device, profiles the model (router traces for MoE), plans, and stores the entry in the wisdom file.
WisdomEntry calibrate_model(const CalibrateOptions& options);

enum class MissingWisdom { calibrate, refuse };
MissingWisdom parse_missing_wisdom(const std::string& name);  // "calibrate" | "refuse"

struct ResolvedPlan {
  WisdomEntry entry;
  bool calibrated_now = false;
  std::string note;  // why a calibration ran, for the log
};

// The plan for this machine and model from the wisdom file. When it is missing or stale (hardware or model
// changed): `calibrate` runs a quick calibration (options.quick forced) and stores it; `refuse` throws WisdomError
// with the lookup's message and the flags that would fix it.
ResolvedPlan resolve_plan(const CalibrateOptions& options, MissingWisdom missing);

// The plan the running process applied (null JSON before any): what the server publishes at GET /wisdom.
void set_active_plan(const WisdomEntry& entry);
boost::json::value active_plan_json();

}  // namespace tierlm::calibrate
