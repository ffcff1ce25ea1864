// calibrate/plan_json.cpp — Plan's JSON form (the wisdom file, `tierlm wisdom show --json`, GET /wisdom).
#include "calibrate/json_fields.h"
#include "calibrate/planner.h"

namespace tierlm::calibrate {

namespace bj = boost::json;

bj::value to_json(const Plan& p) {
  bj::object o;
  o["schema_version"] = Plan::kSchemaVersion;
  o["device_fingerprint"] = p.device_fingerprint;
  o["model_fingerprint"] = p.model_fingerprint;
  o["budget_bytes"] = p.budget_bytes;
  o["context"] = p.context;
  o["batch"] = p.batch;
  o["gpu_layers"] = p.gpu_layers;
  o["gpu_reason"] = p.gpu_reason;
  bj::array gpu_resident;
  for (auto& layer : p.gpu_resident_experts) {
    bj::array ids;
    for (int32_t e : layer) ids.push_back(e);
    gpu_resident.push_back(ids);
  }
  o["gpu"] = bj::object{{"resident_experts", gpu_resident},
                        {"expert_slots", p.gpu_expert_slots},
                        {"cpu_expert_rows", p.gpu_cpu_expert_rows},
                        {"kv_codec", p.gpu_kv_codec},
                        {"budget_bytes", p.gpu_budget_bytes}};
  bj::array resident;
  for (auto& layer : p.resident_experts) {
    bj::array ids;
    for (int32_t e : layer) ids.push_back(e);
    resident.push_back(ids);
  }
  o["resident_experts"] = resident;
  o["cache_slots"] = p.cache_slots;
  o["cache_policy"] = p.cache_policy;
  o["prefetch_limit"] = p.prefetch_limit;
  o["reader"] = bj::object{{"queue_depth", p.reader_queue_depth}, {"block_size", p.reader_block_size}, {"direct", p.reader_direct}};
  o["kv_codec"] = p.kv_codec;
  o["threads"] = p.threads;
  o["numa_placement"] = p.numa_placement;
  o["prefill_chunk"] = p.prefill_chunk;
  const auto& pr = p.prediction;
  bj::object steps, memory, vram;
  for (auto& [k, v] : pr.step_seconds) steps[k] = v;
  for (auto& [k, v] : pr.memory) memory[k] = v;
  for (auto& [k, v] : pr.vram) vram[k] = v;
  o["prediction"] = bj::object{{"decode_tokens_per_second", pr.decode_tokens_per_second},
                               {"prefill_tokens_per_second", pr.prefill_tokens_per_second},
                               {"expert_hit_rate", pr.expert_hit_rate},
                               {"miss_bytes_per_token", pr.miss_bytes_per_token},
                               {"step_seconds", steps},
                               {"memory", memory},
                               {"vram", vram},
                               {"gpu_expert_hit_rate", pr.gpu_expert_hit_rate},
                               {"scratch_peak_bytes", pr.scratch_peak_bytes},
                               {"total_memory", pr.total_memory()}};
  bj::array why;
  for (auto& r : p.rationale) {
    bj::object ms;
    for (auto& [k, v] : r.measurements) ms[k] = v;
    why.push_back(bj::object{{"decision", r.decision}, {"value", r.value}, {"because", r.because}, {"measurements", ms}});
  }
  o["rationale"] = why;
  return o;
}

Plan plan_from_json(const bj::value& v) {
  using namespace json;
  const std::string what = "plan";
  const auto& o = object(v, what);
  if (integer(o, "schema_version", what) != Plan::kSchemaVersion)
    throw std::runtime_error(what + ": unsupported schema_version (re-run tierlm calibrate)");
  Plan p;
  p.device_fingerprint = string(o, "device_fingerprint", what);
  p.model_fingerprint = string(o, "model_fingerprint", what);
  p.budget_bytes = unsigned_integer(o, "budget_bytes", what);
  p.context = integer(o, "context", what);
  p.batch = integer(o, "batch", what);
  p.gpu_layers = int(integer(o, "gpu_layers", what));
  p.gpu_reason = string_or(o, "gpu_reason", "");
  if (const bj::value* g = o.if_contains("gpu")) {
    const auto& go = object(*g, what + ".gpu");
    for (auto& layer : array(go, "resident_experts", what)) {
      if (!layer.is_array()) throw std::runtime_error(what + ": gpu.resident_experts rows must be arrays");
      std::vector<int32_t> ids;
      for (auto& e : layer.get_array()) ids.push_back(int32_t(integer_value(e, what + ": gpu expert ids")));
      p.gpu_resident_experts.push_back(std::move(ids));
    }
    p.gpu_expert_slots = integer(go, "expert_slots", what);
    if (go.contains("cpu_expert_rows")) p.gpu_cpu_expert_rows = integer(go, "cpu_expert_rows", what);
    p.gpu_kv_codec = string_or(go, "kv_codec", "f16");
    p.gpu_budget_bytes = unsigned_integer(go, "budget_bytes", what);
  }
  for (auto& layer : array(o, "resident_experts", what)) {
    if (!layer.is_array()) throw std::runtime_error(what + ": resident_experts rows must be arrays");
    std::vector<int32_t> ids;
    for (auto& e : layer.get_array()) {
      if (!e.is_int64() && !e.is_uint64()) throw std::runtime_error(what + ": expert ids must be integers");
      ids.push_back(int32_t(integer_value(e, what + ": expert ids")));
    }
    p.resident_experts.push_back(std::move(ids));
  }
  p.cache_slots = integer(o, "cache_slots", what);
  p.cache_policy = string(o, "cache_policy", what);
  p.prefetch_limit = integer(o, "prefetch_limit", what);
  const auto& r = object(field(o, "reader", what), what + ".reader");
  p.reader_queue_depth = unsigned(integer(r, "queue_depth", what));
  p.reader_block_size = unsigned_integer(r, "block_size", what);
  p.reader_direct = boolean(r, "direct", what);
  p.kv_codec = string(o, "kv_codec", what);
  p.threads = int(integer(o, "threads", what));
  p.numa_placement = string_or(o, "numa_placement", "");
  p.prefill_chunk = integer(o, "prefill_chunk", what);
  const auto& pr = object(field(o, "prediction", what), what + ".prediction");
  p.prediction.decode_tokens_per_second = number(pr, "decode_tokens_per_second", what);
  p.prediction.prefill_tokens_per_second = number(pr, "prefill_tokens_per_second", what);
  p.prediction.expert_hit_rate = number(pr, "expert_hit_rate", what);
  p.prediction.miss_bytes_per_token = number(pr, "miss_bytes_per_token", what);
  for (auto& [k, v2] : object(field(pr, "step_seconds", what), what))
    p.prediction.step_seconds[std::string(k)] = number_value(v2, what + ": prediction.step_seconds." + std::string(k));
  for (auto& [k, v2] : object(field(pr, "memory", what), what))
    p.prediction.memory[std::string(k)] = unsigned_value(v2, what + ": prediction.memory." + std::string(k));
  if (const bj::value* vram = pr.if_contains("vram"))
    for (auto& [k, v2] : object(*vram, what + ".prediction.vram"))
      p.prediction.vram[std::string(k)] = unsigned_value(v2, what + ": prediction.vram." + std::string(k));
  if (pr.contains("scratch_peak_bytes")) p.prediction.scratch_peak_bytes = unsigned_integer(pr, "scratch_peak_bytes", what);
  if (pr.contains("gpu_expert_hit_rate")) p.prediction.gpu_expert_hit_rate = number(pr, "gpu_expert_hit_rate", what);
  for (auto& x : array(o, "rationale", what)) {
    const auto& xo = object(x, what + ".rationale[]");
    Rationale r2{string(xo, "decision", what), string(xo, "value", what), string(xo, "because", what), {}};
    for (auto& [k, v2] : object(field(xo, "measurements", what), what))
      r2.measurements[std::string(k)] = number_value(v2, what + ": rationale measurement " + std::string(k));
    p.rationale.push_back(std::move(r2));
  }
  if (p.threads < 1 || p.prefill_chunk < 1 || p.context < 1 || p.batch < 1)
    throw std::runtime_error(what + ": threads, prefill_chunk, context and batch must be positive");
  return p;
}

}  // namespace tierlm::calibrate
