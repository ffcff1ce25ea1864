// calibrate/serving_fit.cpp — fit_serving: keep the stored plan, re-plan with the expert cache giving way to KV, or
// refuse with what fits.
#include "calibrate/serving_fit.h"

#include <fmt/format.h>

namespace tierlm::calibrate {

namespace {

std::string mib(uint64_t b) { return fmt::format("{:.1f} MiB", double(b) / double(1 << 20)); }

std::optional<Plan> try_plan(const WisdomEntry& e, const PlanRequest& request, std::string* why = nullptr) {
  try {
    // The stored router trace, as calibrate planned on it (its held-out half judges the re-fitted cache).
    const RouterTrace trace = e.model.router_trace();
    PlanRequest r = request;
    if (trace.tokens() > 0) r.trace = &trace;
    return make_plan(e.device, e.model, r);
  } catch (const PlanError& error) {
    if (why) *why = error.what();
    return std::nullopt;
  }
}

// The largest value in [lo, hi] (in steps of `step`) for which fits() holds, or 0 when none does; fits() is
// monotone (more batch or context never needs less memory).
template <class Fits>
int64_t largest_fitting(int64_t lo, int64_t hi, int64_t step, Fits fits) {
  int64_t a = lo / step, b = hi / step, best = 0;
  while (a <= b) {
    const int64_t mid = a + (b - a) / 2;
    if (fits(mid * step)) {
      best = mid * step;
      a = mid + 1;
    } else {
      b = mid - 1;
    }
  }
  return best;
}

}  // namespace

ServingFit fit_serving(const WisdomEntry& e, const ServingRequest& r) {
  const Plan& stored = e.plan;
  const int64_t batch = r.batch > 0 ? r.batch : stored.batch;
  const int64_t context = r.context > 0 ? r.context : stored.context;
  const uint64_t budget = r.budget_bytes ? r.budget_bytes : stored.budget_bytes;
  const std::string codec = r.kv_codec.value_or(stored.kv_codec);
  // More threads than the plan's take more scratch (a MoE prefill lane each): re-fitted, as a larger batch is.
  const int threads = r.threads > 0 ? r.threads : stored.threads;
  ServingFit fit;
  fit.plan = stored;
  if (batch <= stored.batch && context <= stored.context && codec == stored.kv_codec && budget >= stored.budget_bytes &&
      threads <= stored.threads)
    return fit;

  PlanRequest q;
  q.budget_bytes = budget;
  q.context = context;
  q.batch = batch;
  q.threads = threads;
  q.gpu_layers = stored.gpu_layers;
  q.gpu_budget_bytes = stored.gpu_budget_bytes;  // a --gpu-memory cap stays (0: the plan had no GPU)
  q.kv_codec = codec;
  std::string why;
  std::optional<Plan> p = try_plan(e, q, &why);
  if (!p && !r.kv_codec) {  // the plan's codec cannot hold it: a smaller one may
    q.kv_codec.reset();
    p = try_plan(e, q, &why);
  }
  const std::string asked = fmt::format("{} {} {} {}{}{}", r.batch_flag, batch, r.context_flag, context,
                                        r.budget_bytes ? fmt::format(" {} {}", r.budget_flag, mib(budget)) : "",
                                        threads > stored.threads ? fmt::format(" --threads {}", threads) : "");
  if (p) {
    p->device_fingerprint = stored.device_fingerprint;
    p->model_fingerprint = stored.model_fingerprint;
    const auto kv_of = [](const Plan& plan) {
      auto it = plan.prediction.memory.find("kv");
      return it == plan.prediction.memory.end() ? uint64_t(0) : it->second;
    };
    fit.note = fmt::format(
        "{}: KV for {} x {} positions ({}) needs {} where the plan (batch {}, context {}, {}) holds {}; {} within the "
        "{} budget",
        asked, batch, context, p->kv_codec, mib(kv_of(*p)), stored.batch, stored.context, stored.kv_codec,
        mib(kv_of(stored)),
        e.model.moe() ? fmt::format("the expert cache shrinks from {} resident + {} slots to {} resident + {} slots",
                                    stored.resident_count(), stored.cache_slots, p->resident_count(), p->cache_slots)
                      : std::string("it fits"),
        mib(budget));
    fit.plan = std::move(*p);
    fit.refitted = true;
    return fit;
  }

  // Refuse with what fits: the largest batch at the asked context, and the largest context at the asked batch.
  auto fits = [&](int64_t b, int64_t c) {
    PlanRequest t = q;
    t.batch = b;
    t.context = c;
    return try_plan(e, t).has_value();
  };
  const int64_t best_batch = batch > 1 ? largest_fitting(1, batch - 1, 1, [&](int64_t b) { return fits(b, context); }) : 0;
  const int64_t page = 32;
  const int64_t best_context =
      context > page ? largest_fitting(page, context - 1, page, [&](int64_t c) { return fits(batch, c); }) : 0;
  std::string fits_text;
  if (best_batch > 0) fits_text = fmt::format("{} {} at {} {}", r.batch_flag, best_batch, r.context_flag, context);
  if (best_context > 0)
    fits_text += (fits_text.empty() ? "" : ", or ") +
                 fmt::format("{} {} at {} {}", r.context_flag, best_context, r.batch_flag, batch);
  if (fits_text.empty()) fits_text = fmt::format("not even {} 1 {} {}", r.batch_flag, r.context_flag, page);
  throw ServingFitError(fmt::format("{} does not fit the {} memory budget: {}. What fits: {}. Lower {} or {}, or raise "
                                    "{}",
                                    asked, mib(budget), why, fits_text, r.batch_flag, r.context_flag, r.budget_flag));
}

}  // namespace tierlm::calibrate
