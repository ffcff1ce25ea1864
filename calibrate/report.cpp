// calibrate/report.cpp — render_entry: fixed-width tables and bars (plain ASCII, readable in any log).
#include "calibrate/report.h"

#include <algorithm>

#include <fmt/format.h>

namespace tierlm::calibrate {

namespace {

std::string bytes(double b) {
  if (b >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  return fmt::format("{:.0f} KiB", b / 1024);
}

std::string bar(double fraction, int width) {
  const int filled = int(std::clamp(fraction, 0.0, 1.0) * width + 0.5);
  std::string out(size_t(width) + 2, '.');  // built in place: GCC 12 warns (-Wrestrict, falsely) on the + chain
  out.front() = '[';
  out.back() = ']';
  std::fill_n(out.begin() + 1, filled, '#');
  return out;
}

}  // namespace

std::string render_entry(const WisdomEntry& e) {
  const DeviceProfile& d = e.device;
  const ModelProfile& m = e.model;
  const Plan& p = e.plan;
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  line(fmt::format("wisdom  device {}  model {}  created {}", p.device_fingerprint, p.model_fingerprint, e.created_at));
  line("");
  line("machine");
  line(fmt::format("  {}", d.identity()));
  line(fmt::format("  memory   total {}  available {}  limit {}  usable {}  hugepages {}x{} ({} free)  THP {}",
                   bytes(double(d.memory.total)), bytes(double(d.memory.available)), bytes(double(d.memory.limit())),
                   bytes(double(d.memory.usable())), d.memory.hugepages_total, bytes(double(d.memory.hugepage_bytes)),
                   d.memory.hugepages_free, d.memory.transparent_hugepages.empty() ? "?" : d.memory.transparent_hugepages));
  for (auto& b : d.bandwidth)
    line(fmt::format("  RAM      node {}: read {:.1f} GB/s  copy {:.1f}  triad {:.1f} ({} threads)", b.node, b.read_gbs,
                     b.copy_gbs, b.triad_gbs, b.threads));
  line(fmt::format("  storage  {} on {} ({}), O_DIRECT {}, io_uring {}: best {:.2f} GB/s, 4 KiB {:.0f} IOPS{}",
                   d.storage.path, d.storage.device.empty() ? "?" : d.storage.device, d.storage.filesystem,
                   d.storage.direct_io ? "yes" : "no", d.storage.io_uring ? "yes" : "no", d.storage.best_gbs(),
                   d.storage.iops_4k(), d.storage.warning.empty() ? "" : "  (" + d.storage.warning + ")"));
  line(fmt::format("  {:>8} {:>14} {:>14} {:>14} {:>15} {:>16} {:>15}", "threads", "SGEMM GFLOP/s", "q8 matvec GB/s",
                   "q4 matvec GB/s", "f16 matvec GB/s", "bf16 matvec GB/s", "f32 matvec GB/s"));
  for (auto& c : d.compute)
    line(fmt::format("  {:>8} {:>14.1f} {:>14.2f} {:>14.2f} {:>15.2f} {:>16.2f} {:>15.2f}", c.threads, c.sgemm_gflops,
                     c.matvec_q8_gbs, c.matvec_q4_gbs, c.matvec_f16_gbs, c.matvec_bf16_gbs, c.matvec_f32_gbs));
  for (auto& c : d.compute) {
    if (c.matmul_gflops.empty()) continue;
    std::string rates;
    for (auto& [format, gflops] : c.matmul_gflops) rates += fmt::format("  {} {:.1f}", format, gflops);
    line(fmt::format("  prefill GEMM GFLOP/s ({} threads, 128 rows):{}", c.threads, rates));
  }
  for (auto& c : d.compute) {
    if (c.expert_gemm_gflops.empty()) continue;
    std::string rates;
    for (auto& [format, gflops] : c.expert_gemm_gflops) rates += fmt::format("  {} {:.1f}", format, gflops);
    line(fmt::format("  MoE experts GFLOP/s ({} threads, 16 rows each):{}", c.threads, rates));
  }
  line(d.gpu.present ? fmt::format("  GPU      {}: {} ({} free), device memory {:.0f} GB/s, host-to-device {:.1f} GB/s",
                                   d.gpu.name, bytes(double(d.gpu.memory)), bytes(double(d.gpu.free_memory)),
                                   d.gpu.memory_gbs, d.gpu.h2d_gbs)
                     : fmt::format("  GPU      none: {}", d.gpu.reason));
  line("");
  line(fmt::format("model    {} ({}), {} layers, weights {}{}", m.path, m.model_type, m.layers, m.weight_format,
                   m.moe() ? fmt::format(", {} experts x {} layers, top-{}, expert {} ({})", m.experts, m.moe_layers,
                                         m.top_k, bytes(double(m.expert_bytes)), m.expert_format)
                           : ""));
  for (auto& c : m.classes) line(fmt::format("  {:<14} {:>12}", c.name, bytes(double(c.bytes))));
  if (m.moe()) line(fmt::format("  expert frequencies: {}", m.frequency_source));
  for (auto& t : m.timings)
    line(fmt::format("  decode timing @{} threads: step {}, expert {:.1f} us, router {:.1f} us, miss {:.0f} us alone / "
                     "{:.0f} us in a batch",
                     t.threads,
                     t.step_seconds > 0 ? fmt::format("{:.3f} ms (fixed routing, all experts in memory)",
                                                      t.step_seconds * 1e3)
                                        : std::string("not timed (the memory budget holds fewer than layers x top_k "
                                                      "experts; the plan's step is analytic)"),
                     t.expert_seconds * 1e6, t.router_seconds * 1e6, t.miss_seconds * 1e6,
                     t.miss_batch_seconds * 1e6));
  line("");
  line(fmt::format("plan     budget {}, context {}, batch {}", bytes(double(p.budget_bytes)), p.context, p.batch));
  line(fmt::format("  {:<16} {}", "threads", p.threads));
  line(fmt::format("  {:<16} {}", "numa", p.numa_placement));
  line(fmt::format("  {:<16} {}", "prefill chunk", p.prefill_chunk));
  line(fmt::format("  {:<16} {}", "kv codec", p.kv_codec));
  line(fmt::format("  {:<16} {} ({})", "gpu layers", p.gpu_layers, p.gpu_reason));
  if (p.gpu_layers > 0) {
    line(fmt::format("  {:<16} device KV {}, VRAM budget {}", "gpu", p.gpu_kv_codec, bytes(double(p.gpu_budget_bytes))));
    if (m.moe()) {
      std::string per_layer;
      for (auto& l : p.gpu_resident_experts) per_layer += fmt::format("{} ", l.size());
      line(fmt::format("  {:<16} {} resident in VRAM + {} VRAM slots (hit rate {:.1f}%); the others {}", "gpu experts",
                       p.gpu_resident_count(), p.gpu_expert_slots, 100 * p.prediction.gpu_expert_hit_rate,
                       p.gpu_cpu_expert_rows > 0 ? fmt::format("on the CPU in steps of <= {} rows", p.gpu_cpu_expert_rows)
                                                 : std::string("copied into slots")));
      line(fmt::format("  {:<16} {}", "vram/layer", per_layer));
    }
  }
  if (m.moe()) {
    line(fmt::format("  {:<16} {} of {} ({} policy, prefetch {})", "resident experts", p.resident_count(),
                     m.moe_layers * m.experts, p.cache_policy, p.prefetch_limit));
    line(fmt::format("  {:<16} {}", "cache slots", p.cache_slots));
    line(fmt::format("  {:<16} block {} KiB, queue depth {}, O_DIRECT {}", "reader", p.reader_block_size / 1024,
                     p.reader_queue_depth, p.reader_direct ? "yes" : "no"));
    std::string per_layer;
    for (size_t l = 0; l < p.resident_experts.size(); ++l) per_layer += fmt::format("{} ", p.resident_experts[l].size());
    line(fmt::format("  {:<16} {}", "resident/layer", per_layer));
  }
  line("");
  line("predicted");
  line(fmt::format("  decode {:.2f} tok/s, prefill {:.1f} tok/s, expert hit rate {:.1f}%, {} read per token",
                   p.prediction.decode_tokens_per_second, p.prediction.prefill_tokens_per_second,
                   100 * p.prediction.expert_hit_rate, bytes(p.prediction.miss_bytes_per_token)));
  std::string terms;
  for (auto& [k, v] : p.prediction.step_seconds) terms += fmt::format("{} {:.2f} ms  ", k, v * 1e3);
  line("  step: " + terms);
  line(fmt::format("  memory by account ({} of {} budget)", bytes(double(p.prediction.total_memory())),
                   bytes(double(p.budget_bytes))));
  for (auto& [account, b] : p.prediction.memory)
    line(fmt::format("    {:<17} {} {:>11} {:5.1f}%", account, bar(double(b) / double(p.budget_bytes), 40),
                     bytes(double(b)), 100.0 * double(b) / double(p.budget_bytes)));
  if (!p.prediction.vram.empty()) {
    uint64_t total = 0;
    for (auto& [_, b] : p.prediction.vram) total += b;
    line(fmt::format("  VRAM by account ({} of {} budget)", bytes(double(total)), bytes(double(p.gpu_budget_bytes))));
    for (auto& [account, b] : p.prediction.vram)
      line(fmt::format("    {:<17} {} {:>11} {:5.1f}%", account,
                       bar(double(b) / double(std::max<uint64_t>(p.gpu_budget_bytes, 1)), 40), bytes(double(b)),
                       100.0 * double(b) / double(std::max<uint64_t>(p.gpu_budget_bytes, 1))));
  }
  line("");
  line("why");
  for (auto& r : p.rationale) {
    std::string ms;
    for (auto& [k, v] : r.measurements) ms += fmt::format("{}={:.4g} ", k, v);
    line(fmt::format("  {:<14} {:<28} {}", r.decision, r.value, r.because));
    if (!ms.empty()) line(fmt::format("  {:<14} {}", "", ms));
  }
  return out;
}

}  // namespace tierlm::calibrate
