// The hard memory budget: a synthetic Qwen3-MoE-shaped model whose experts are about twice a cgroup v1 memory
// limit runs inside that cgroup with a ledger budget below the limit. Oracle: the same model run outside the cgroup
// with every expert cached must give the same greedy tokens and logits. Also checked: the child was not OOM-killed,
// the ledger never went over budget, and peak RSS stayed within budget + the stated overhead.
// Needs root and a writable /sys/fs/cgroup/memory; otherwise skipped with the reason printed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "runtime/engine/forward.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic_moe.h"
#include "tests/runtime/model/safetensors_writer.h"
#include "server/process_stats.h"

using namespace tierlm;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t kBudget = 32 * MiB;          // the ledger: weights + expert cache + KV + scratch
constexpr uint64_t kOverhead = 48 * MiB;        // stated RSS overhead: code, libraries, thread stacks, allocator
constexpr uint64_t kLimit = kBudget + kOverhead;  // the cgroup limit
constexpr int kSteps = 12;
#if defined(__SANITIZE_ADDRESS__)
constexpr uint64_t kSanitizerRss = 64 * MiB;  // ASan's shadow memory and quarantine, outside anything a budget governs
#else
constexpr uint64_t kSanitizerRss = 0;
#endif

model::SyntheticMoeSpec spec() {
  model::SyntheticMoeSpec s;
  s.layers = 4;
  s.experts = 88;
  s.top_k = 4;
  s.hidden = 512;
  s.expert_intermediate = 512;
  s.heads = 8;
  s.kv_heads = 4;
  s.head_dim = 64;
  s.vocab = 1024;
  s.seed = 7;
  return s;
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // after the last step
};

Output generate(const std::filesystem::path& dir, tiering::Ledger& ledger, model::LoadOptions options, int steps,
                tiering::ExpertTierTelemetry* telemetry = nullptr) {
  options.ledger = &ledger;
  auto w = model::load_model(dir, options);
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, 8, 64);
  engine::KVCache cache(w.config, 64, ledger);
  const int64_t V = w.config.vocab_size;
  std::vector<int32_t> prompt = {1, 100, 200, 300, 400, 500, 600, 700};
  Output out;
  out.logits.resize(size_t(V));
  forward.run(prompt, 0, cache, out.logits.data());
  int64_t pos = int64_t(prompt.size());
  for (int s = 0; s < steps; ++s) {
    const int32_t next = int32_t(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
    out.tokens.push_back(next);
    forward.run(std::span(&next, 1), pos++, cache, out.logits.data());
  }
  if (telemetry) *telemetry = w.experts->telemetry();
  return out;
}

uint64_t peak_rss() {
  return server::peak_resident_set_bytes().value_or(0);
}

bool write_file(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.flush();
  return bool(out);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The constrained half, run only as the child process the test below starts inside the cgroup.
TEST(MemoryBudget, ChildRun) {
  const char* dir = getenv("TIERLM_BUDGET_CHILD_DIR");
  const char* out_file = getenv("TIERLM_BUDGET_CHILD_OUT");
  if (!dir || !out_file) GTEST_SKIP() << "only runs as the child of ModelTwiceTheCgroupLimitRunsCorrectly";
  tiering::Ledger ledger(kBudget);
  model::LoadOptions o;
  o.experts.cache.slots = 0;  // as many as the budget allows
  o.experts.leave_free_bytes = 2 * MiB;
  tiering::ExpertTierTelemetry t;
  Output out = generate(dir, ledger, o, kSteps, &t);
  std::ostringstream msg;
  msg.precision(9);
  msg << ledger.peak() << ' ' << peak_rss() << ' ' << t.cache_slots << ' ' << t.bytes_read << ' ' << t.hits << ' '
      << t.misses << ' ' << (t.direct_io ? 1 : 0);
  for (int32_t tok : out.tokens) msg << ' ' << tok;
  for (float f : out.logits) msg << ' ' << f;
  ASSERT_TRUE(write_file(out_file, msg.str()));
}

TEST(MemoryBudget, ModelTwiceTheCgroupLimitRunsCorrectly) {
  const std::string root = "/sys/fs/cgroup/memory";
  if (geteuid() != 0 || access(root.c_str(), W_OK) != 0)
    GTEST_SKIP() << "skipped: needs root and a writable cgroup v1 memory hierarchy at " << root;
  test::TempDir dir;
  const auto s = spec();
  model::write_synthetic_moe(dir.path, s);
  const uint64_t expert_bytes = model::synthetic_moe_expert_bytes(s);
  std::printf("synthetic model: experts %.1f MiB (%.2fx the %.0f MiB cgroup limit), ledger budget %.0f MiB\n",
              expert_bytes / double(MiB), expert_bytes / double(kLimit), kLimit / double(MiB), kBudget / double(MiB));
  ASSERT_GE(expert_bytes, 2 * kLimit * 95 / 100);

  // Oracle: outside the cgroup, everything cached.
  const int steps = kSteps;
  Output reference;
  {
    tiering::Ledger unlimited;
    model::LoadOptions o;
    o.experts.cache.slots = s.layers * s.experts;
    reference = generate(dir.path, unlimited, o, steps);
  }

  const std::string group = root + "/tierlm_moe_budget_" + std::to_string(getpid());
  ASSERT_EQ(mkdir(group.c_str(), 0755), 0) << "cannot create " << group;
  ASSERT_TRUE(write_file(group + "/memory.limit_in_bytes", std::to_string(kLimit)));
  write_file(group + "/memory.swappiness", "0");

  // The constrained run is a fresh process (fork + exec of this binary) so its RSS is its own, not the parent's.
  const std::string out_file = (dir / "child.out").string();
  const pid_t child = fork();
  if (child == 0) {
    if (!write_file(group + "/cgroup.procs", std::to_string(getpid()))) _exit(3);
    setenv("TIERLM_BUDGET_CHILD_DIR", dir.path.c_str(), 1);
    setenv("TIERLM_BUDGET_CHILD_OUT", out_file.c_str(), 1);
    execl("/proc/self/exe", "memory_budget_test", "--gtest_filter=MemoryBudget.ChildRun", nullptr);
    _exit(5);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const std::string oom = read_file(group + "/memory.oom_control");
  const uint64_t max_usage = std::stoull(read_file(group + "/memory.max_usage_in_bytes"));
  const std::string failcnt = read_file(group + "/memory.failcnt");
  rmdir(group.c_str());

  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (OOM?) — " << oom;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(std::filesystem::exists(out_file)) << "the child wrote no result";
  EXPECT_NE(oom.find("oom_kill 0"), std::string::npos) << oom;
  std::istringstream in(read_file(out_file));
  uint64_t ledger_peak, rss, slots, bytes_read, hits, misses, direct;
  in >> ledger_peak >> rss >> slots >> bytes_read >> hits >> misses >> direct;
  Output got;
  for (int i = 0; i < steps; ++i) {
    int32_t t;
    in >> t;
    got.tokens.push_back(t);
  }
  for (float f; in >> f;) got.logits.push_back(f);
  std::printf("in cgroup: ledger peak %.1f MiB of %.0f, peak RSS %.1f MiB (budget + overhead = %.0f MiB), cgroup max "
              "usage %.1f MiB, failcnt %s, %llu slots, %llu hits / %llu misses, %.1f MiB read, O_DIRECT %s\n",
              ledger_peak / double(MiB), kBudget / double(MiB), rss / double(MiB), kLimit / double(MiB),
              max_usage / double(MiB), failcnt.substr(0, failcnt.size() - 1).c_str(), (unsigned long long)slots,
              (unsigned long long)hits, (unsigned long long)misses, bytes_read / double(MiB), direct ? "yes" : "no");
  EXPECT_LE(ledger_peak, kBudget);
  EXPECT_LE(rss, kBudget + kOverhead + kSanitizerRss);
  EXPECT_GT(misses, 0u);
  EXPECT_EQ(direct, 1u);
  EXPECT_EQ(got.tokens, reference.tokens);
  ASSERT_EQ(got.logits.size(), reference.logits.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.logits.size(); ++i) {
    num = std::max(num, double(std::fabs(got.logits[i] - reference.logits[i])));
    den = std::max(den, double(std::fabs(reference.logits[i])));
  }
  EXPECT_LT(num / den, 1e-4);
}

}  // namespace
