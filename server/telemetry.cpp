#include "server/telemetry.h"

#include <sys/resource.h>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "calibrate/calibration.h"
#include "runtime/kv/page_pool.h"
#include "server/process_stats.h"

namespace tierlm::server {

namespace json = boost::json;

namespace {
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
json::value optional_number(const std::optional<uint64_t>& v) { return v ? json::value(*v) : json::value(nullptr); }
json::value budget_number(uint64_t budget) {
  return budget == tiering::Ledger::kUnlimited ? json::value(nullptr) : json::value(budget);
}

// Prometheus label values escape backslash, double quote and newline.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// One metric family: HELP and TYPE once, then its samples.
struct Exposition {
  std::string text;
  void family(const char* name, const char* type, const char* help) {
    text += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, double value, const std::string& labels = {}) {
    if (labels.empty()) text += fmt::format("{} {}\n", name, value);
    else text += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }
};
}  // namespace

Telemetry::Telemetry(ServerInfo info, tiering::Ledger& ledger, const engine::Scheduler& scheduler)
    : info_(std::move(info)), ledger_(ledger), scheduler_(scheduler), start_(std::chrono::steady_clock::now()) {}

void Telemetry::set_tiering(std::shared_ptr<const TieringCountersProvider> provider) {
  std::lock_guard lock(mutex_);
  tiering_ = std::move(provider);
}

void Telemetry::set_gpu(std::shared_ptr<const GpuCountersProvider> provider) {
  std::lock_guard lock(mutex_);
  gpu_ = std::move(provider);
}

GpuCounters Telemetry::gpu() const {
  std::shared_ptr<const GpuCountersProvider> p;
  {
    std::lock_guard lock(mutex_);
    p = gpu_;
  }
  return p ? p->gpu_counters() : GpuCounters{};
}

TieringCounters Telemetry::tiering() const {
  std::shared_ptr<const TieringCountersProvider> p;
  {
    std::lock_guard lock(mutex_);
    p = tiering_;
  }
  return p ? p->counters() : TieringCounters{};
}

void Telemetry::record_request(const std::string& route, int status, double seconds) {
  std::lock_guard lock(mutex_);
  requests_[{route, status}] += 1;
  auto& buckets = latency_[route];
  size_t i = 0;
  while (i < kBuckets.size() && seconds > kBuckets[i]) ++i;
  buckets[i] += 1;
  latency_sum_[route] += seconds;
}

void Telemetry::record_refusal(const std::string& reason) {
  std::lock_guard lock(mutex_);
  refusals_[reason] += 1;
}

json::object Telemetry::health() const {
  const auto s = scheduler_.stats();
  const auto t = tiering();
  json::object h;
  h["status"] = "ok";
  json::object model;
  model["id"] = info_.model_id;
  model["path"] = info_.model_path;
  model["architecture"] = info_.architecture;
  model["weight_bytes"] = info_.weight_bytes;
  model["chat_template"] = info_.chat_template;
  h["model"] = std::move(model);
  json::object plan;
  const json::value active = calibrate::active_plan_json();
  if (active.is_null()) {
    plan["status"] = "none";
    plan["note"] = "no wisdom plan is active (--no-wisdom): defaults and command-line flags are in use";
  } else {
    plan["status"] = "active";
    // The plan's headline decisions; GET /wisdom has all of it with the measurements behind each.
    const json::object* top = active.if_object();
    const json::object* decided = top && top->contains("plan") ? top->at("plan").if_object() : nullptr;
    for (const json::object* o : {top, decided})
      if (o)
        for (const char* key : {"device_fingerprint", "model_fingerprint", "created_at", "budget_bytes", "threads",
                                "prefill_chunk", "kv_codec", "cache_slots", "cache_policy", "gpu_layers"})
          if (auto* v = o->if_contains(key)) plan[key] = *v;
    if (decided)
      if (auto* pr = decided->if_contains("prediction"); pr && pr->is_object())
        for (const char* key : {"decode_tokens_per_second", "prefill_tokens_per_second", "expert_hit_rate", "total_memory"})
          if (auto* v = pr->as_object().if_contains(key)) plan[std::string("predicted_") + key] = *v;
  }
  plan["threads_in_use"] = s.threads > 0 ? s.threads : info_.threads;  // what "0: auto" resolved to
  plan["max_batch"] = scheduler_.options().max_batch;
  plan["prefill_size"] = scheduler_.options().prefill_size;
  plan["context"] = scheduler_.context();
  h["plan"] = std::move(plan);

  json::object memory;
  memory["ledger_budget_bytes"] = budget_number(ledger_.budget());
  memory["ledger_used_bytes"] = ledger_.used();
  memory["ledger_peak_bytes"] = ledger_.peak();
  json::object accounts;
  for (const auto& a : ledger_.snapshot()) {
    json::object o;
    o["bytes"] = a.bytes;
    o["peak_bytes"] = a.peak_bytes;
    o["allocations"] = a.allocations;
    accounts[a.name] = std::move(o);
  }
  memory["accounts"] = std::move(accounts);
  json::object tiers;
  tiers["ram"] = ledger_.used();
  for (const auto& [name, bytes] : t.bytes_by_tier) tiers[name] = bytes;
  memory["tiers"] = std::move(tiers);
  memory["rss_bytes"] = optional_number(resident_set_bytes());
  const auto cg = cgroup_memory();
  json::object cgroup;
  cgroup["version"] = cg.version;
  cgroup["limit_bytes"] = optional_number(cg.limit_bytes);
  cgroup["usage_bytes"] = optional_number(cg.usage_bytes);
  memory["cgroup"] = std::move(cgroup);
  h["memory"] = std::move(memory);

  json::object tier;
  tier["available"] = t.available;
  if (!t.available) tier["note"] = "no tier counters attached (dense model or expert tier not built): zeros";
  tier["source"] = t.source;
  tier["disk_bytes_read"] = t.disk_bytes_read;
  tier["disk_reads"] = t.disk_reads;
  tier["cache_hits"] = t.cache_hits;
  tier["cache_misses"] = t.cache_misses;
  tier["cache_hit_rate"] = t.hit_rate();
  tier["read_stall_seconds"] = t.read_stall_seconds;
  // Per miss besides the read wait: converting the read bytes into the slot format (0 for a packed expert file).
  tier["conversions"] = t.conversions;
  tier["conversion_seconds"] = t.conversion_seconds;
  // The forward thread's share: conversions it did itself, their time, and its wait for the worker's.
  tier["inline_conversions"] = t.inline_conversions;
  tier["inline_conversion_seconds"] = t.inline_conversion_seconds;
  tier["conversion_wait_seconds"] = t.conversion_wait_seconds;
  // The forward thread's time in the MoE blocks and, of it, running the experts (the rest of a token: attention,
  // dense layers, sampling; of the MoE time besides compute: read stall, conversions, routing).
  tier["moe_seconds"] = t.moe_seconds;
  tier["expert_compute_seconds"] = t.expert_compute_seconds;
  // Expert loads that failed: a demand load fails its request (HTTP 500 naming the expert), a prefetch is dropped.
  tier["expert_read_errors"] = t.expert_read_errors;
  // Lookahead prefetch (runtime/engine/moe.cpp): reads started, requests they served, reads evicted unused.
  tier["prefetches"] = t.prefetches;
  tier["prefetch_hits"] = t.prefetch_hits;
  tier["prefetch_wasted"] = t.prefetch_wasted;
  // Guesses left unread while reading them did not pay (tiering::prefetch_worth_it), and the guesses' precision.
  tier["prefetch_skipped"] = t.prefetch_skipped;
  tier["prefetch_precision"] = t.prefetch_precision;
  h["tiering"] = std::move(tier);

  const auto g = gpu();
  json::object device;
  device["layers"] = g.layers;
  if (g.layers > 0) {
    device["model_layers"] = g.model_layers;
    device["output_head"] = g.output_head;
    device["weight_bytes"] = g.weight_bytes;
    json::object vram;
    vram["budget_bytes"] = budget_number(g.vram_budget);
    vram["used_bytes"] = g.vram_used;
    vram["peak_bytes"] = g.vram_peak;
    json::object vram_accounts;
    for (const auto& a : g.vram_accounts)
      vram_accounts[a.name] = json::object{{"bytes", a.bytes}, {"peak_bytes", a.peak_bytes}, {"allocations", a.allocations}};
    vram["accounts"] = std::move(vram_accounts);
    device["vram"] = std::move(vram);
    device["experts"] = json::object{{"resident_hits", g.expert_resident_hits}, {"slot_hits", g.expert_slot_hits},
                                  {"misses", g.expert_misses},             {"bytes_copied", g.expert_bytes_copied},
                                  {"hit_rate", g.expert_hit_rate()},       {"device_routed_layer_steps", g.expert_device_routed},
                                  {"on_cpu", g.expert_cpu}};
  }
  h["gpu"] = std::move(device);

  json::object kv;
  kv["slots"] = s.slots;
  kv["context"] = s.context;
  kv["bytes"] = s.kv_bytes;
  kv["windowed_bytes"] = s.kv_windowed_bytes;  // sliding-window layers: bounded to window + one chunk
  kv["bytes_without_windows"] = s.kv_bytes_without_windows;
  kv["positions_capacity"] = s.slots * s.context;
  kv["positions_used"] = s.kv_positions_used;
  kv["positions_cached"] = s.kv_positions_cached;
  kv["usage"] = s.slots > 0 && s.context > 0 ? double(s.kv_positions_used) / double(s.slots * s.context) : 0.0;
  kv["prefix_cache_hit_tokens"] = s.cached_tokens_total;
  kv["prefix_cache"] = s.prefix_cache;  // "whole_state" for models with recurrent layers (runtime/engine/scheduler.h)
  json::object by_codec;  // every live KV page pool in the process, by codec
  for (const auto& c : kv::kv_bytes_by_codec()) {
    if (c.reserved_bytes == 0 && c.used_bytes == 0) continue;
    by_codec[kv::codec_name(c.codec)] = json::object{{"reserved_bytes", c.reserved_bytes}, {"used_bytes", c.used_bytes}};
  }
  kv["bytes_by_codec"] = std::move(by_codec);
  h["kv"] = std::move(kv);

  json::object requests;
  requests["in_flight"] = s.active + s.waiting;
  requests["active"] = s.active;
  requests["queued"] = s.waiting;
  requests["queue_limit"] = scheduler_.options().queue_limit;
  requests["connections"] = connections_.load();
  requests["rejected"] = rejected_.load();
  requests["timed_out"] = s.sequences_timed_out;
  json::object refused;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [reason, count] : refusals_) refused[reason] = count;
  }
  requests["refused_by_reason"] = std::move(refused);
  h["requests"] = std::move(requests);

  json::object tokens;
  tokens["prompt_total"] = s.prompt_tokens_total;
  tokens["prefilled_total"] = s.prefilled_tokens_total;
  tokens["generated_total"] = s.generated_tokens_total;
  tokens["mean_batch"] = s.steps_total ? double(s.batched_rows_total) / double(s.steps_total) : 0.0;
  h["tokens"] = std::move(tokens);
  h["uptime_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return h;
}

std::string Telemetry::metrics() const {
  const auto s = scheduler_.stats();
  const auto t = tiering();
  Exposition e;
  e.family("tierlm_up", "gauge", "1 while the server is serving.");
  e.sample("tierlm_up", 1);
  e.family("tierlm_info", "gauge", "Static facts about the served model (value 1).");
  e.sample("tierlm_info", 1, fmt::format("model=\"{}\",architecture=\"{}\",chat_template=\"{}\"", label(info_.model_id),
                                         label(info_.architecture), label(info_.chat_template)));

  e.family("tierlm_memory_bytes", "gauge", "Bytes charged to each ledger account.");
  for (const auto& a : ledger_.snapshot()) e.sample("tierlm_memory_bytes", double(a.bytes), fmt::format("account=\"{}\"", label(a.name)));
  e.family("tierlm_memory_peak_bytes", "gauge", "High-water mark of each ledger account.");
  for (const auto& a : ledger_.snapshot())
    e.sample("tierlm_memory_peak_bytes", double(a.peak_bytes), fmt::format("account=\"{}\"", label(a.name)));
  e.family("tierlm_memory_tier_bytes", "gauge", "Bytes held per storage tier (ram = ledger total).");
  e.sample("tierlm_memory_tier_bytes", double(ledger_.used()), "tier=\"ram\"");
  for (const auto& [name, bytes] : t.bytes_by_tier)
    e.sample("tierlm_memory_tier_bytes", double(bytes), fmt::format("tier=\"{}\"", label(name)));
  e.family("tierlm_ledger_budget_bytes", "gauge", "Ledger budget (absent samples mean unlimited).");
  if (ledger_.budget() != tiering::Ledger::kUnlimited) e.sample("tierlm_ledger_budget_bytes", double(ledger_.budget()));
  e.family("tierlm_process_resident_memory_bytes", "gauge", "Resident set size from /proc/self/statm.");
  if (auto rss = resident_set_bytes()) e.sample("tierlm_process_resident_memory_bytes", double(*rss));
  const auto cg = cgroup_memory();
  e.family("tierlm_cgroup_memory_limit_bytes", "gauge", "Memory limit of the process's cgroup (absent when unlimited).");
  if (cg.limit_bytes) e.sample("tierlm_cgroup_memory_limit_bytes", double(*cg.limit_bytes), fmt::format("version=\"{}\"", cg.version));

  e.family("tierlm_tiering_available", "gauge", "1 when tier counters are attached; 0 means the tier metrics read zero.");
  e.sample("tierlm_tiering_available", t.available ? 1 : 0);
  e.family("tierlm_disk_read_bytes_total", "counter", "Bytes read from disk by the expert tier.");
  e.sample("tierlm_disk_read_bytes_total", double(t.disk_bytes_read));
  e.family("tierlm_disk_reads_total", "counter", "Read operations issued by the expert tier.");
  e.sample("tierlm_disk_reads_total", double(t.disk_reads));
  e.family("tierlm_expert_cache_hits_total", "counter", "Expert lookups served from memory.");
  e.sample("tierlm_expert_cache_hits_total", double(t.cache_hits));
  e.family("tierlm_expert_cache_misses_total", "counter", "Expert lookups that read from disk.");
  e.sample("tierlm_expert_cache_misses_total", double(t.cache_misses));
  e.family("tierlm_expert_read_stall_seconds_total", "counter", "Time the forward pass waited for expert reads.");
  e.sample("tierlm_expert_read_stall_seconds_total", t.read_stall_seconds);
  e.family("tierlm_expert_conversion_seconds_total", "counter",
           "Time spent converting read experts into the slot format, on the cache's worker or the forward thread.");
  e.sample("tierlm_expert_conversion_seconds_total", t.conversion_seconds);
  e.family("tierlm_expert_inline_conversions_total", "counter",
           "Expert conversions the forward thread did itself (the rest ran on the cache's worker).");
  e.sample("tierlm_expert_inline_conversions_total", double(t.inline_conversions));
  e.family("tierlm_expert_inline_conversion_seconds_total", "counter", "Time those inline conversions took.");
  e.sample("tierlm_expert_inline_conversion_seconds_total", t.inline_conversion_seconds);
  e.family("tierlm_expert_conversion_wait_seconds_total", "counter",
           "Time the forward pass waited for the worker to finish converting an expert it needed.");
  e.sample("tierlm_expert_conversion_wait_seconds_total", t.conversion_wait_seconds);
  e.family("tierlm_moe_seconds_total", "counter",
           "Time the forward pass spent in the MoE blocks of streamed layers (routing, reads, conversions, experts).");
  e.sample("tierlm_moe_seconds_total", t.moe_seconds);
  e.family("tierlm_expert_compute_seconds_total", "counter", "Of that time, running the experts.");
  e.sample("tierlm_expert_compute_seconds_total", t.expert_compute_seconds);
  e.family("tierlm_expert_read_errors_total", "counter",
           "Expert loads that failed (a demand load fails its request; a failed prefetch is dropped).");
  e.sample("tierlm_expert_read_errors_total", double(t.expert_read_errors));

  const auto g = gpu();
  e.family("tierlm_gpu_layers", "gauge", "Model layers running on the GPU (0: CPU only; the GPU metrics are absent).");
  e.sample("tierlm_gpu_layers", double(g.layers));
  if (g.layers > 0) {
    e.family("tierlm_gpu_output_head", "gauge", "1 when the final norm and output head run on the GPU too.");
    e.sample("tierlm_gpu_output_head", g.output_head ? 1 : 0);
    e.family("tierlm_gpu_weight_bytes", "gauge", "Device bytes of the weights uploaded to the GPU.");
    e.sample("tierlm_gpu_weight_bytes", double(g.weight_bytes));
    e.family("tierlm_gpu_vram_bytes", "gauge", "Bytes charged to each VRAM ledger account.");
    for (const auto& a : g.vram_accounts)
      e.sample("tierlm_gpu_vram_bytes", double(a.bytes), fmt::format("account=\"{}\"", label(a.name)));
    e.family("tierlm_gpu_vram_peak_bytes", "gauge", "High-water mark of each VRAM ledger account.");
    for (const auto& a : g.vram_accounts)
      e.sample("tierlm_gpu_vram_peak_bytes", double(a.peak_bytes), fmt::format("account=\"{}\"", label(a.name)));
    e.family("tierlm_gpu_vram_budget_bytes", "gauge", "VRAM ledger budget (absent samples mean unlimited).");
    if (g.vram_budget != tiering::Ledger::kUnlimited) e.sample("tierlm_gpu_vram_budget_bytes", double(g.vram_budget));
    e.family("tierlm_gpu_expert_hits_total", "counter",
             "Expert uses on the GPU served from VRAM, by tier (resident set or LRU slot).");
    e.sample("tierlm_gpu_expert_hits_total", double(g.expert_resident_hits), "tier=\"resident\"");
    e.sample("tierlm_gpu_expert_hits_total", double(g.expert_slot_hits), "tier=\"slot\"");
    e.family("tierlm_gpu_expert_misses_total", "counter", "Expert uses on the GPU that copied the expert into VRAM.");
    e.sample("tierlm_gpu_expert_misses_total", double(g.expert_misses));
    e.family("tierlm_gpu_expert_copied_bytes_total", "counter", "Expert bytes copied from host memory to VRAM.");
    e.sample("tierlm_gpu_expert_copied_bytes_total", double(g.expert_bytes_copied));
    e.family("tierlm_gpu_moe_device_routed_total", "counter",
             "MoE layer steps on the GPU routed on the device (decode with every expert of the layer in VRAM).");
    e.sample("tierlm_gpu_moe_device_routed_total", double(g.expert_device_routed));
    e.family("tierlm_gpu_expert_cpu_total", "counter",
             "Experts of GPU layers run on the CPU instead of copied into VRAM (hybrid placement), one per expert "
             "and step.");
    e.sample("tierlm_gpu_expert_cpu_total", double(g.expert_cpu));
  }

  e.family("tierlm_requests_in_flight", "gauge", "Generation requests admitted or queued.");
  e.sample("tierlm_requests_in_flight", double(s.active + s.waiting));
  e.family("tierlm_requests_queued", "gauge", "Generation requests waiting for a KV slot.");
  e.sample("tierlm_requests_queued", double(s.waiting));
  e.family("tierlm_requests_rejected_total", "counter", "Requests refused because the queue was full.");
  e.sample("tierlm_requests_rejected_total", double(rejected_.load()));
  e.family("tierlm_connections", "gauge", "Open HTTP connections.");
  e.sample("tierlm_connections", double(connections_.load()));
  e.family("tierlm_kv_positions_used", "gauge", "KV positions filled by running sequences.");
  e.sample("tierlm_kv_positions_used", double(s.kv_positions_used));
  e.family("tierlm_kv_positions_capacity", "gauge", "KV positions over all slots.");
  e.sample("tierlm_kv_positions_capacity", double(s.slots * s.context));
  e.family("tierlm_kv_bytes", "gauge", "Bytes allocated for the KV caches.");
  e.sample("tierlm_kv_bytes", double(s.kv_bytes));
  e.family("tierlm_kv_codec_reserved_bytes", "gauge", "KV page-pool bytes reserved, by codec.");
  const auto kv_codecs = kv::kv_bytes_by_codec();
  for (const auto& c : kv_codecs)
    e.sample("tierlm_kv_codec_reserved_bytes", double(c.reserved_bytes), fmt::format("codec=\"{}\"", kv::codec_name(c.codec)));
  e.family("tierlm_kv_codec_used_bytes", "gauge", "KV page bytes holding positions, by codec.");
  for (const auto& c : kv_codecs)
    e.sample("tierlm_kv_codec_used_bytes", double(c.used_bytes), fmt::format("codec=\"{}\"", kv::codec_name(c.codec)));
  e.family("tierlm_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  e.sample("tierlm_prompt_tokens_total", double(s.prompt_tokens_total));
  e.family("tierlm_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose KV rows were reused.");
  e.sample("tierlm_prefix_cache_hit_tokens_total", double(s.cached_tokens_total));
  e.family("tierlm_generation_tokens_total", "counter", "Tokens generated.");
  e.sample("tierlm_generation_tokens_total", double(s.generated_tokens_total));
  e.family("tierlm_engine_steps_total", "counter", "Batched forward steps run by the scheduler.");
  e.sample("tierlm_engine_steps_total", double(s.steps_total));
  e.family("tierlm_engine_busy_seconds_total", "counter", "Time the engine spent in forward passes and sampling.");
  e.sample("tierlm_engine_busy_seconds_total", s.busy_seconds);
  e.family("tierlm_sequences_cancelled_total", "counter", "Generations cancelled (client gone).");
  e.sample("tierlm_sequences_cancelled_total", double(s.sequences_cancelled));
  e.family("tierlm_sequences_timed_out_total", "counter", "Generations finished by the request deadline.");
  e.sample("tierlm_sequences_timed_out_total", double(s.sequences_timed_out));

  std::lock_guard lock(mutex_);
  e.family("tierlm_http_rejected_total", "counter",
           "Requests and connections refused before being served, by reason (they also count in "
           "tierlm_http_requests_total with their status code).");
  for (const auto& [reason, count] : refusals_)
    e.sample("tierlm_http_rejected_total", double(count), fmt::format("reason=\"{}\"", label(reason)));
  e.family("tierlm_http_requests_total", "counter", "HTTP requests by route and status code.");
  for (const auto& [key, count] : requests_)
    e.sample("tierlm_http_requests_total", double(count), fmt::format("route=\"{}\",code=\"{}\"", label(key.first), key.second));
  e.family("tierlm_http_request_duration_seconds", "histogram", "Time from request read to response end, by route.");
  for (const auto& [route, buckets] : latency_) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      cumulative += buckets[i];
      e.sample("tierlm_http_request_duration_seconds_bucket", double(cumulative),
               fmt::format("route=\"{}\",le=\"{}\"", label(route), kBuckets[i]));
    }
    cumulative += buckets[kBuckets.size()];
    e.sample("tierlm_http_request_duration_seconds_bucket", double(cumulative), fmt::format("route=\"{}\",le=\"+Inf\"", label(route)));
    e.sample("tierlm_http_request_duration_seconds_sum", latency_sum_.at(route), fmt::format("route=\"{}\"", label(route)));
    e.sample("tierlm_http_request_duration_seconds_count", double(cumulative), fmt::format("route=\"{}\"", label(route)));
  }
  return e.text;
}

json::object Telemetry::snapshot(TelemetryCursor& cursor) const {
  const auto s = scheduler_.stats();
  const auto t = tiering();
  const auto now = std::chrono::steady_clock::now();
  const bool first = cursor.time == std::chrono::steady_clock::time_point{};
  const double dt = first ? 0 : std::chrono::duration<double>(now - cursor.time).count();
  auto rate = [&](uint64_t total, uint64_t before) { return dt > 0 ? double(total - before) / dt : 0.0; };
  json::object o;
  o["time"] = unix_seconds();
  json::object memory;
  for (const auto& a : ledger_.snapshot()) memory[a.name] = a.bytes;
  o["memory"] = std::move(memory);
  json::object tiers;
  tiers["ram"] = ledger_.used();
  for (const auto& [name, bytes] : t.bytes_by_tier) tiers[name] = bytes;
  o["tiers"] = std::move(tiers);
  o["rss_bytes"] = optional_number(resident_set_bytes());
  o["cgroup_limit_bytes"] = optional_number(cgroup_memory().limit_bytes);
  o["generation_tokens_per_second"] = rate(s.generated_tokens_total, cursor.generated);
  o["prefill_tokens_per_second"] = rate(s.prefilled_tokens_total, cursor.prefilled);
  const uint64_t dh = first ? 0 : t.cache_hits - cursor.hits, dm = first ? 0 : t.cache_misses - cursor.misses;
  o["hit_rate"] = dh + dm ? double(dh) / double(dh + dm) : t.hit_rate();
  o["hit_rate_total"] = t.hit_rate();
  o["tiering_available"] = t.available;
  o["disk_bytes_read"] = t.disk_bytes_read;
  const auto g = gpu();
  o["gpu_layers"] = g.layers;
  if (g.layers > 0) {
    o["gpu_vram_used_bytes"] = g.vram_used;
    o["gpu_expert_hit_rate"] = g.expert_hit_rate();
  }
  o["requests_in_flight"] = s.active + s.waiting;
  o["requests_queued"] = s.waiting;
  o["kv_positions_used"] = s.kv_positions_used;
  o["kv_positions_capacity"] = s.slots * s.context;
  o["generated_tokens_total"] = s.generated_tokens_total;
  cursor.time = now;
  cursor.generated = s.generated_tokens_total;
  cursor.prefilled = s.prefilled_tokens_total;
  cursor.hits = t.cache_hits;
  cursor.misses = t.cache_misses;
  return o;
}

}  // namespace tierlm::server
