// bench/moe_tier_bench.cpp — decode speed of a MoE model larger than its memory budget, three ways:
//   tier   our expert tier: ledger budget B, expert cache sized to it, misses read with io_uring + O_DIRECT;
//   mmap   the same packed experts used in place from a read-only mmap, the page cache left to the kernel;
//   bound  the NVMe bound: measured read bandwidth / (miss rate x active expert bytes per token).
// Both runs happen in child processes inside a cgroup v1 memory group limited to B + overhead, so the page cache of
// the mmap run is held to the same memory as the tier. The model is synthetic (runtime/model/synthetic_moe.h):
// Qwen3-MoE-shaped, 4-bit experts, written to disk at ~2x B.
//
// Routing generator (the router is bypassed so popularity is controlled; weights are 1/k):
//   skewed   per layer, a fixed random permutation maps popularity rank r -> expert id, and rank r has probability
//            proportional to 1/(r+1)^s (Zipf, s = --zipf, default 1.0). Temporal reuse: each of a token's k choices
//            repeats one of the same layer's choices for the previous token with probability --reuse (default 0.5),
//            otherwise it is a fresh Zipf draw; duplicates within a token are redrawn.
//   uniform  k distinct experts drawn uniformly per layer and token.
// Both use a fixed seed, so the tier and mmap runs see the same expert sequence.
//
// Usage: moe_tier_bench [--dir D] [--budget-mib B] [--layers L] [--experts E] [--top-k K] [--hidden H]
//                       [--expert-size I] [--tokens N] [--warmup W] [--keep]
// Prints a table; deletes the model unless --keep. Needs root + cgroup v1 for the limits (else runs unlimited and
// says so).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/engine/forward.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic_moe.h"
#include "tiering/expert_reader.h"
#include "tiering/expert_store.h"

using namespace tierlm;

namespace {

constexpr uint64_t MiB = 1ull << 20;

struct Options {
  std::string dir = "/work/moe-bench-model";
  uint64_t budget_mib = 1536, overhead_mib = 96;
  model::SyntheticMoeSpec spec;
  int tokens = 48, warmup = 16;
  double zipf = 1.0, reuse = 0.5;
  bool keep = false;
  std::vector<std::string> argv;  // as given, for the child runs
};

class Router {
 public:
  Router(const Options& o, bool skewed) : o_(o), skewed_(skewed), rng_(12345) {
    const int64_t E = o.spec.experts;
    for (int64_t l = 0; l < o.spec.layers; ++l) {
      std::vector<int32_t> perm(static_cast<size_t>(E));
      for (int64_t i = 0; i < E; ++i) perm[size_t(i)] = int32_t(i);
      std::shuffle(perm.begin(), perm.end(), rng_);
      rank_to_expert_.push_back(perm);
    }
    std::vector<double> w(static_cast<size_t>(E));
    for (int64_t r = 0; r < E; ++r) w[size_t(r)] = 1.0 / std::pow(double(r + 1), o.zipf);
    zipf_ = std::discrete_distribution<int>(w.begin(), w.end());
    previous_.resize(size_t(o.spec.layers));
  }
  // One token's choice for a layer (called once per layer per decode step; rows beyond 0 reuse it).
  void choose(int64_t layer, std::span<int32_t> experts, std::span<float> weights) {
    const int64_t k = int64_t(experts.size()), E = o_.spec.experts;
    std::set<int32_t> chosen;
    auto& prev = previous_[size_t(layer)];
    std::uniform_real_distribution<double> u(0, 1);
    while (int64_t(chosen.size()) < k) {
      int32_t e;
      if (!skewed_) {
        e = int32_t(std::uniform_int_distribution<int64_t>(0, E - 1)(rng_));
      } else if (!prev.empty() && u(rng_) < o_.reuse) {
        e = prev[std::uniform_int_distribution<size_t>(0, prev.size() - 1)(rng_)];
      } else {
        e = rank_to_expert_[size_t(layer)][size_t(zipf_(rng_))];
      }
      chosen.insert(e);
    }
    prev.assign(chosen.begin(), chosen.end());
    int64_t j = 0;
    for (int32_t e : chosen) {
      experts[size_t(j)] = e;
      weights[size_t(j++)] = 1.0f / float(k);
    }
  }

 private:
  const Options& o_;
  bool skewed_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> rank_to_expert_;
  std::discrete_distribution<int> zipf_;
  std::vector<std::vector<int32_t>> previous_;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Random whole-expert O_DIRECT reads at the tier's queue depth: the device bandwidth the bound uses.
double measure_read_bandwidth(const std::filesystem::path& file, tiering::ReaderOptions ro, double seconds) {
  tiering::ExpertStore store = tiering::ExpertStore::open_packed(file);
  tiering::ExpertReader reader(store.files(), ro);
  const uint64_t block = store.layout().bytes;
  const int depth = 8;  // experts in flight, as when a layer misses most of its top-8
  tiering::Ledger ledger;
  tiering::LedgerBuffer buf(ledger, "bench", block * depth, 4096);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> pick(0, store.layers() * store.experts() - 1);
  // A sliding window: one expert is submitted as soon as the oldest completes, so `depth` stay in flight.
  auto submit = [&](int i) {
    const int64_t x = pick(rng);
    const auto ext = store.extents(x / store.experts(), x % store.experts())[0];
    const tiering::ReadRequest r{ext.file, ext.offset, ext.length, buf.as<char>() + uint64_t(i) * block};
    return reader.submit(std::span(&r, 1));
  };
  std::vector<tiering::ExpertReader::Ticket> tickets;
  const double start = now();
  for (int i = 0; i < depth; ++i) tickets.push_back(submit(i));
  uint64_t bytes = 0;
  for (int i = 0; now() - start < seconds; i = (i + 1) % depth) {
    reader.wait(tickets[size_t(i)]);
    bytes += block;
    tickets[size_t(i)] = submit(i);
  }
  reader.drain();
  return double(bytes) / (now() - start);
}

struct RunResult {
  double tokens_per_second = 0, hit_rate = 0, bytes_read_per_token = 0, stall_per_token = 0;
  double ledger_peak_mib = 0, rss_mib = 0, cgroup_max_mib = 0, disk_read_per_token = 0;
  int64_t slots = 0;
};

uint64_t proc_io_read_bytes() {
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t v;
  while (in >> key >> v)
    if (key == "read_bytes:") return v;
  return 0;
}

RunResult run_decode(const Options& o, bool mapped, bool skewed) {
  tiering::Ledger ledger(o.budget_mib * MiB);
  model::LoadOptions lo;
  lo.ledger = &ledger;
  lo.weight_format = kernels::WeightFormat::q4;
  lo.expert_format = o.spec.expert_format;
  lo.experts.cache.slots = 0;  // fill the budget
  lo.experts.cache.mapped = mapped;
  lo.experts.cache.prefetch_limit = 0;  // the synthetic routing is not predictable by the lookahead router
  lo.experts.leave_free_bytes = 24 * MiB;
  lo.experts.min_slots = o.spec.top_k;
  auto w = model::load_model(o.dir, lo);
  kernels::ThreadPool pool(2);
  const int64_t context = o.tokens + o.warmup + 16;
  engine::Forward forward(w, pool, ledger, 8, context);
  engine::KVCache cache(w.config, context, ledger);
  Router router(o, skewed);
  forward.moe()->set_routing_override(
      [&](int64_t layer, int64_t, std::span<int32_t> e, std::span<float> wt) { router.choose(layer, e, wt); });
  std::vector<float> logits(size_t(w.config.vocab_size));
  int64_t pos = 0;
  int32_t token = 1;
  auto step = [&] {
    forward.run(std::span(&token, 1), pos++, cache, logits.data());
    token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  for (int i = 0; i < o.warmup; ++i) step();
  w.experts->cache().reset_counters();
  const uint64_t io0 = proc_io_read_bytes();
  const double start = now();
  for (int i = 0; i < o.tokens; ++i) step();
  const double elapsed = now() - start;
  const auto t = w.experts->telemetry();
  RunResult r;
  r.tokens_per_second = o.tokens / elapsed;
  r.hit_rate = t.hit_rate();
  r.bytes_read_per_token = double(t.bytes_read) / o.tokens;
  r.stall_per_token = t.read_stall_seconds / o.tokens;
  r.ledger_peak_mib = ledger.peak() / double(MiB);
  r.disk_read_per_token = double(proc_io_read_bytes() - io0) / o.tokens;
  r.slots = t.cache_slots;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) r.rss_mib = std::stod(line.substr(6)) / 1024.0;
  return r;
}

bool write_file(const std::string& path, const std::string& v) {
  std::ofstream out(path);
  out << v;
  out.flush();
  return bool(out);
}

// Runs run_decode in a child inside a fresh memory cgroup (limit = budget + overhead) and returns its result.
RunResult run_in_cgroup(const Options& o, bool mapped, bool skewed, bool use_cgroup) {
  // Start cold: drop the expert file from the page cache so the mmap run's pages are charged to its cgroup.
  {
    const int fd = ::open((o.dir + "/experts.tierlm").c_str(), O_RDONLY);
    if (fd >= 0) {
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  const std::string group = "/sys/fs/cgroup/memory/tierlm_moe_bench_" + std::to_string(getpid());
  if (use_cgroup) {
    mkdir(group.c_str(), 0755);
    write_file(group + "/memory.limit_in_bytes", std::to_string((o.budget_mib + o.overhead_mib) * MiB));
  }
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  // A fresh process (fork + exec of this binary) joins the cgroup, so its memory is its own, not the parent's.
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    if (use_cgroup && !write_file(group + "/cgroup.procs", std::to_string(getpid()))) _exit(3);
    std::vector<std::string> args = o.argv;
    for (const char* a : {"--child", mapped ? "mmap" : "tier", skewed ? "skewed" : "uniform", "--result-fd"})
      args.push_back(a);
    args.push_back(std::to_string(fds[1]));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(5);
  }
  close(fds[1]);
  RunResult r{};
  const bool got = read(fds[0], &r, sizeof r) == ssize_t(sizeof r);
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (use_cgroup) {
    std::ifstream in(group + "/memory.max_usage_in_bytes");
    uint64_t max_usage = 0;
    in >> max_usage;
    r.cgroup_max_mib = max_usage / double(MiB);
    rmdir(group.c_str());
  }
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(std::string("decode run failed") +
                             (WIFSIGNALED(status) ? " (killed: signal " + std::to_string(WTERMSIG(status)) + ")" : ""));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.spec.layers = 8;
  std::string child_mode, child_routing;
  int result_fd = -1;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--child") break;
    o.argv.push_back(a);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir") o.dir = next();
    else if (a == "--budget-mib") o.budget_mib = std::stoull(next());
    else if (a == "--overhead-mib") o.overhead_mib = std::stoull(next());
    else if (a == "--layers") o.spec.layers = std::stoll(next());
    else if (a == "--experts") o.spec.experts = std::stoll(next());
    else if (a == "--top-k") o.spec.top_k = std::stoll(next());
    else if (a == "--hidden") o.spec.hidden = std::stoll(next());
    else if (a == "--expert-size") o.spec.expert_intermediate = std::stoll(next());
    else if (a == "--tokens") o.tokens = std::stoi(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--zipf") o.zipf = std::stod(next());
    else if (a == "--reuse") o.reuse = std::stod(next());
    else if (a == "--keep") o.keep = true;
    else if (a == "--child") {
      child_mode = next();
      child_routing = next();
    } else if (a == "--result-fd") result_fd = std::stoi(next());
    else {
      std::fprintf(stderr, "unknown option %s (see the comment at the top of bench/moe_tier_bench.cpp)\n", a.c_str());
      return 2;
    }
  }
  if (!child_mode.empty()) {  // one decode run, inside the cgroup the parent chose
    try {
      const RunResult r = run_decode(o, child_mode == "mmap", child_routing == "skewed");
      return write(result_fd, &r, sizeof r) == ssize_t(sizeof r) ? 0 : 4;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "run failed: %s\n", e.what());
      return 2;
    }
  }
  const auto& s = o.spec;
  const uint64_t expert_file = model::synthetic_moe_expert_bytes(s);
  std::printf("model: %lld layers x %lld experts (top-%lld), hidden %lld, expert %lld, q4 experts; expert file %.2f GiB "
              "= %.2fx the %llu MiB budget\n",
              (long long)s.layers, (long long)s.experts, (long long)s.top_k, (long long)s.hidden,
              (long long)s.expert_intermediate, expert_file / double(1ull << 30),
              expert_file / double(o.budget_mib * MiB), (unsigned long long)o.budget_mib);
  const std::filesystem::path dir(o.dir);
  if (!std::filesystem::exists(dir / "experts.tierlm") ||
      std::filesystem::file_size(dir / "experts.tierlm") != expert_file) {
    const double t0 = now();
    model::write_synthetic_moe(dir, s);
    std::printf("generated in %.1f s at %s\n", now() - t0, o.dir.c_str());
  }
  const bool use_cgroup = geteuid() == 0 && access("/sys/fs/cgroup/memory", W_OK) == 0;
  if (!use_cgroup) std::printf("NOTE: no writable cgroup v1 memory hierarchy: runs are NOT memory-limited\n");

  tiering::ReaderOptions ro;
  const double bandwidth = measure_read_bandwidth(dir / "experts.tierlm", ro, 3.0);
  const uint64_t expert_bytes = tiering::ExpertStore::open_packed(dir / "experts.tierlm").layout().bytes;
  const double active = double(s.layers * s.top_k) * double(expert_bytes);
  std::printf("O_DIRECT random expert reads (8 experts in flight, queue depth %u, %llu KiB blocks): %.2f GB/s; active "
              "expert bytes per token %.1f MiB\n",
              ro.queue_depth, (unsigned long long)(ro.block_size / 1024), bandwidth / 1e9, active / double(MiB));
  std::printf("cgroup limit per run: %llu MiB (budget %llu + overhead %llu)\n\n",
              (unsigned long long)(o.budget_mib + o.overhead_mib), (unsigned long long)o.budget_mib,
              (unsigned long long)o.overhead_mib);
  std::printf("%-8s %7s %6s %9s %10s %10s %9s %10s %10s %8s %9s %8s\n", "routing", "slots", "hit", "MiB/tok",
              "tier t/s", "bound t/s", "of bound", "stall/tok", "mmap t/s", "tier/mmap", "mmap MiB/t", "peakMiB");
  for (bool skewed : {true, false}) {
    const RunResult tier = run_in_cgroup(o, false, skewed, use_cgroup);
    const RunResult mapped = run_in_cgroup(o, true, skewed, use_cgroup);
    const double miss = 1.0 - tier.hit_rate;
    const double bound = miss > 0 ? bandwidth / (miss * active) : INFINITY;
    std::printf("%-8s %7lld %6.3f %9.1f %10.2f %10.2f %8.0f%% %8.1fms %10.2f %9.2fx %9.1f %8.0f\n",
                skewed ? "skewed" : "uniform", (long long)tier.slots, tier.hit_rate, tier.bytes_read_per_token / MiB,
                tier.tokens_per_second, bound, 100.0 * tier.tokens_per_second / bound, tier.stall_per_token * 1e3,
                mapped.tokens_per_second, tier.tokens_per_second / mapped.tokens_per_second,
                mapped.disk_read_per_token / MiB, tier.cgroup_max_mib);
    std::printf("         (tier: ledger peak %.0f MiB, RSS after decode %.0f MiB; mmap: cgroup max %.0f MiB, RSS after decode %.0f MiB)\n",
                tier.ledger_peak_mib, tier.rss_mib, mapped.cgroup_max_mib, mapped.rss_mib);
    std::fflush(stdout);
  }
  if (!o.keep) std::filesystem::remove_all(dir);
  return 0;
}
