// calibrate/calibration.cpp — calibrate_model, resolve_plan and the active plan.
#include "calibrate/calibration.h"

#include <ctime>
#include <mutex>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "calibrate/probe_limits.h"
#include "calibrate/probes.h"

namespace tierlm::calibrate {

namespace fs = std::filesystem;

WisdomEntry calibrate_model(const CalibrateOptions& o) {
  if (!fs::exists(o.model_dir / "config.json"))
    throw std::runtime_error("calibrate: " + o.model_dir.string() + " has no config.json (pass --model DIR)");
  ProbeOptions probe;
  probe.quick = o.quick;
  probe.storage_dir = o.model_dir.string();
  probe.storage_file = largest_model_file(o.model_dir.string());  // the tier's own reads, on the model's own file
  probe.progress = o.progress;
  WisdomEntry entry;
  entry.device = probe_device(probe);

  ModelProfileOptions mp;
  mp.prompts_dir = o.prompts_dir;
  mp.weight_format = o.weight_format;
  mp.max_seconds = o.quick ? std::min(o.trace_seconds, 5.0) : o.trace_seconds;
  if (o.quick) mp.max_tokens_per_prompt = 24;
  mp.progress = o.progress;
  for (auto& c : entry.device.compute) mp.timing_threads.push_back(c.threads);  // every count the planner may pick
  mp.timing_seconds = o.quick ? 0.15 : 0.4;
  mp.kv_quality_seconds = o.quick ? 10 : 60;
  // The model measurement holds what a plan would: the default budget's share of the memory usable now (the
  // probes' buffers are gone by then), so calibrate fits where serve will.
  mp.memory_budget_bytes = uint64_t(double(entry.device.memory.usable()) * kDefaultBudgetFraction);
  RouterTrace trace;
  mp.trace = &trace;
  entry.model = measure_model_profile(o.model_dir, mp);

  PlanRequest request;
  request.budget_bytes = o.budget_bytes;
  request.gpu_budget_bytes = o.gpu_budget_bytes;
  request.context = std::min<int64_t>(o.context, std::max<int64_t>(entry.model.max_context, 1));
  request.batch = o.batch;
  request.fit_batch = o.fit_batch;
  if (trace.tokens() > 0) request.trace = &trace;
  entry.plan = make_plan(entry.device, entry.model, request);
  // The model's dense prefill shapes at the plan's threads: the plan's prefill prediction moves from the device's
  // square-weight probe to the shapes' own rates (nothing else in the plan depends on them).
  ProbeOptions shapes;
  shapes.seconds_per_probe = kPrefillProbeSeconds;
  shapes.memory_budget = probe_memory_budget(probe_memory());
  entry.model.prefill = probe_prefill(entry.model, entry.plan.threads, entry.plan.kv_codec, shapes);
  entry.plan.prediction.prefill_tokens_per_second = predicted_prefill_rate(entry.device, entry.model, entry.plan);
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  entry.created_at = stamp;

  // Under the lock, merged with whatever is there now: a calibration that ran alongside this one keeps its entry.
  update_wisdom(o.wisdom_path, [&](Wisdom& wisdom) { wisdom.upsert(entry); });
  return entry;
}

MissingWisdom parse_missing_wisdom(const std::string& name) {
  if (name == "calibrate") return MissingWisdom::calibrate;
  if (name == "refuse") return MissingWisdom::refuse;
  throw std::invalid_argument("--on-missing-wisdom must be 'calibrate' or 'refuse', not '" + name + "'");
}

namespace {
ResolvedPlan calibrate_quickly(const CalibrateOptions& o, const std::string& why) {
  CalibrateOptions quick = o;
  quick.quick = true;
  ResolvedPlan r;
  r.entry = calibrate_model(quick);
  r.calibrated_now = true;
  r.note = why;
  return r;
}
}  // namespace

ResolvedPlan resolve_plan(const CalibrateOptions& o, MissingWisdom missing) {
  Wisdom wisdom;
  try {
    wisdom = load_wisdom(o.wisdom_path, o.model_dir);
  } catch (const CorruptWisdomError& e) {
    if (missing == MissingWisdom::refuse)
      throw WisdomError(std::string(e.what()) + " (or pass --on-missing-wisdom calibrate to move it aside and "
                        "calibrate quickly now, or --no-wisdom to run on explicit flags only)");
    // Never overwritten: calibrate_model's update moves it aside (PATH.corrupt-TIME) and logs where.
    spdlog::warn("[wisdom] {} is corrupt ({}) — moving it aside and running a quick calibration now",
                 e.path().string(), e.problem());
    return calibrate_quickly(o, e.what());
  }
  const DeviceProfile device = probe_device_identity(o.model_dir.string());
  const std::string model_fp = model_fingerprint(o.model_dir, o.weight_format);
  const WisdomLookup lookup = find_wisdom(wisdom, device, o.model_dir, model_fp, o.wisdom_path);
  if (lookup.status == WisdomLookup::Status::found) {
    ResolvedPlan r;
    r.entry = *lookup.entry;
    return r;
  }
  if (missing == MissingWisdom::refuse)
    throw WisdomError(lookup.message + " (or pass --on-missing-wisdom calibrate to calibrate quickly now, or "
                      "--no-wisdom to run on explicit flags only)");
  spdlog::warn("wisdom: {} — running a quick calibration now", lookup.message);
  return calibrate_quickly(o, lookup.message);
}

namespace {
std::mutex active_mutex;
boost::json::value active_plan = nullptr;
}  // namespace

void set_active_plan(const WisdomEntry& e) {
  boost::json::object o{{"device_fingerprint", e.plan.device_fingerprint},
                        {"model_fingerprint", e.plan.model_fingerprint},
                        {"model", e.model.path},
                        {"created_at", e.created_at},
                        {"plan", to_json(e.plan)}};
  std::lock_guard lock(active_mutex);
  active_plan = std::move(o);
}

boost::json::value active_plan_json() {
  std::lock_guard lock(active_mutex);
  return active_plan;
}

}  // namespace tierlm::calibrate
