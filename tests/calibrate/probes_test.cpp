// Probes: parsing of meminfo/cgroup trees (fake and, as root, a real cgroup v1 limit), topology sanity, the storage
// sweep (bounded, cleans up, O_DIRECT fallback), and router traces on the tiny MoE fixture.
#include <gtest/gtest.h>

#include <cblas.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <chrono>
#include <fstream>
#include <set>

#include "calibrate/model_profile.h"
#include "calibrate/probe_limits.h"
#include "calibrate/probes.h"
#include "runtime/model/config.h"
#include "runtime/gpu/gpu_probe.h"
#include "server/process_stats.h"

namespace tierlm::calibrate {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const fs::path& base = fs::temp_directory_path()) {
    path = base / ("tierlm-probe-test-" + std::to_string(::getpid()) + "-" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// VmHWM of this process.
#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer keeps freed blocks in a quarantine (256 MiB by default) before reusing them, so a probe that frees
// and allocates its buffers in turn grows the peak RSS by what it freed: the RSS bound below would measure ASan. This
// binary runs without the quarantine (use-after-free of a block freed long before is then missed, the rest checked).
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=0"; }
#endif

uint64_t peak_rss_bytes() {
  return server::peak_resident_set_bytes().value_or(0);
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(Probes, MemoryReadsMeminfoHugepagesAndCgroupV1) {
  TempDir dir;
  SystemPaths paths;
  paths.proc_meminfo = (dir.path / "meminfo").string();
  paths.proc_self_cgroup = (dir.path / "cgroup").string();
  paths.cgroup_root = (dir.path / "sys").string();
  paths.thp_enabled = (dir.path / "thp").string();
  write(paths.proc_meminfo, "MemTotal:       16000000 kB\nMemFree: 1 kB\nMemAvailable:   12000000 kB\n"
                            "HugePages_Total:      8\nHugePages_Free:       3\nHugepagesize:       2048 kB\n");
  write(paths.proc_self_cgroup, "4:memory:/jobs/me\n0::/\n");
  write(dir.path / "sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write(dir.path / "sys/memory/jobs/memory.limit_in_bytes", "8589934592\n");      // parent: 8 GiB
  write(dir.path / "sys/memory/jobs/me/memory.limit_in_bytes", "10737418240\n");  // own: 10 GiB (parent binds)
  write(dir.path / "sys/memory/jobs/me/memory.usage_in_bytes", "1073741824\n");
  write(paths.thp_enabled, "always [madvise] never\n");
  const MemoryInfo m = probe_memory(paths);
  EXPECT_EQ(m.total, 16000000ull * 1024);
  EXPECT_EQ(m.available, 12000000ull * 1024);
  EXPECT_EQ(m.hugepages_total, 8u);
  EXPECT_EQ(m.hugepages_free, 3u);
  EXPECT_EQ(m.hugepage_bytes, 2048u * 1024);
  EXPECT_EQ(m.transparent_hugepages, "madvise");
  ASSERT_TRUE(m.cgroup_v1_limit);
  EXPECT_EQ(*m.cgroup_v1_limit, 8ull << 30);
  EXPECT_FALSE(m.cgroup_v2_limit);
  EXPECT_EQ(m.limit(), 8ull << 30);
  EXPECT_EQ(m.usable(), 7ull << 30);  // limit minus the cgroup's usage, below MemAvailable
}

TEST(Probes, MemoryReadsCgroupV2) {
  TempDir dir;
  SystemPaths paths;
  paths.proc_meminfo = (dir.path / "meminfo").string();
  paths.proc_self_cgroup = (dir.path / "cgroup").string();
  paths.cgroup_root = (dir.path / "sys").string();
  write(paths.proc_meminfo, "MemTotal: 8000000 kB\nMemAvailable: 7000000 kB\n");
  write(paths.proc_self_cgroup, "0::/user.slice/app\n");
  write(dir.path / "sys/cgroup.controllers", "memory\n");
  write(dir.path / "sys/user.slice/memory.max", "max\n");
  write(dir.path / "sys/user.slice/app/memory.max", "2147483648\n");
  write(dir.path / "sys/user.slice/app/memory.current", "536870912\n");
  const MemoryInfo m = probe_memory(paths);
  ASSERT_TRUE(m.cgroup_v2_limit);
  EXPECT_EQ(*m.cgroup_v2_limit, 2ull << 30);
  EXPECT_EQ(m.limit(), 2ull << 30);
  EXPECT_EQ(m.usable(), 1536ull << 20);
}

// As root on a cgroup v1 machine: a child process in a fresh memory cgroup limited to 1 GiB sees that limit.
TEST(Probes, RealCgroupV1LimitIsSeen) {
  const fs::path parent = "/sys/fs/cgroup/memory";
  if (::geteuid() != 0 || !fs::exists(parent / "memory.limit_in_bytes")) GTEST_SKIP() << "needs root and cgroup v1";
  const fs::path group = parent / ("tierlm-probe-test-" + std::to_string(::getpid()));
  std::error_code ec;
  if (!fs::create_directory(group, ec)) GTEST_SKIP() << "cannot create " << group << ": " << ec.message();
  std::ofstream(group / "memory.limit_in_bytes") << (1ull << 30);
  const pid_t child = ::fork();
  if (child == 0) {
    std::ofstream(group / "cgroup.procs") << ::getpid();
    const MemoryInfo m = probe_memory();
    ::_exit(m.cgroup_v1_limit && *m.cgroup_v1_limit == (1ull << 30) && m.limit() == (1ull << 30) ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  fs::remove(group, ec);  // rmdir of an empty cgroup
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child did not see its 1 GiB cgroup v1 limit";
}

TEST(Probes, TopologyIsConsistent) {
  const Topology t = probe_topology();
  EXPECT_GE(t.packages, 1);
  EXPECT_GE(t.numa_nodes, 1);
  EXPECT_GE(t.cores, t.packages);
  EXPECT_GE(t.threads, t.cores);
  EXPECT_LE(t.threads, int(::sysconf(_SC_NPROCESSORS_CONF)));
  EXPECT_FALSE(t.caches.empty());
  for (auto& c : t.caches) EXPECT_GT(c.bytes, 0u);
  EXPECT_TRUE(t.isa == "scalar" || t.isa == "avx2" || t.isa == "avx512");
}

TEST(Probes, StorageSweepIsBoundedAndCleansUp) {
  TempDir dir(TIERLM_SOURCE_DIR "/build-cal");  // the repository's filesystem, not a tmpfs
  ProbeOptions o;
  o.quick = true;
  o.seconds_per_probe = 1.0;
  o.storage_dir = dir.path.string();
  size_t calls = 0;
  o.progress = [&](const std::string& stage, size_t, size_t) {
    EXPECT_EQ(stage, "storage");
    ++calls;
  };
  const auto start = std::chrono::steady_clock::now();
  const StorageInfo s = probe_storage(o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 15.0);
  EXPECT_EQ(s.sweep.size(), 9u);  // quick: 3 block sizes x 3 depths
  EXPECT_GE(calls, 10u);
  for (auto& x : s.sweep) {
    EXPECT_GT(x.gbs, 0.0);
    EXPECT_GT(x.iops, 0.0);
    EXPECT_NEAR(x.gbs * 1e9, x.iops * double(x.block_size), x.gbs * 1e9 * 1e-6);
    EXPECT_GT(x.cpu_seconds_per_read, 0.0);  // the submitting thread's CPU per read (the reader's block choice)
    EXPECT_LT(x.cpu_seconds_per_read, 1.0 / x.iops * 2.0 + 1e-3);
  }
  EXPECT_FALSE(s.filesystem.empty());
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the scratch file was left behind";
  EXPECT_TRUE(s.direct_io || !s.warning.empty());
}

// Given the model's own file (ProbeOptions::storage_file, at least kStorageFileMinBytes), the sweep reads it in
// place: nothing written next to it, the file unchanged, and the profile names it; a smaller file leaves the sweep
// on a scratch file.
TEST(Probes, StorageSweepReadsTheModelsOwnFileInPlace) {
  TempDir dir(TIERLM_SOURCE_DIR "/build-cal");
  const fs::path model = dir.path / "experts.tierlm";
  {
    std::ofstream out(model, std::ios::binary);
    std::vector<char> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = char(i * 31 + 7);
    for (uint64_t i = 0; i < (kStorageFileMinBytes >> 20); ++i) out.write(chunk.data(), std::streamsize(chunk.size()));
  }
  std::ofstream(dir.path / "config.json") << "{}";
  std::ofstream(dir.path / "model-00001-of-00001.safetensors") << "small";
  EXPECT_EQ(largest_model_file(dir.path.string()), model.string());
  EXPECT_EQ(largest_model_file((dir.path / "missing").string()), "");
  const auto written = fs::last_write_time(model);
  ProbeOptions o;
  o.quick = true;
  o.seconds_per_probe = 0.5;
  o.storage_dir = dir.path.string();
  o.storage_file = model.string();
  const StorageInfo s = probe_storage(o);
  EXPECT_EQ(s.file, model.string());
  EXPECT_EQ(s.sweep.size(), 9u);
  for (const StorageSample& c : s.sweep) EXPECT_GT(c.gbs, 0);
  EXPECT_EQ(fs::file_size(model), kStorageFileMinBytes);
  EXPECT_EQ(fs::last_write_time(model), written);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 3u);  // no scratch file written (or left)
  o.storage_file = (dir.path / "model-00001-of-00001.safetensors").string();
  EXPECT_EQ(probe_storage(o).file, "");  // too small to measure on: the scratch file
}

TEST(Probes, StorageFallsBackWithAWarningWhereODirectIsRefused) {
  if (!fs::exists("/dev/shm")) GTEST_SKIP();
  TempDir dir("/dev/shm");
  ProbeOptions o;
  o.quick = true;
  o.seconds_per_probe = 0.3;
  o.storage_dir = dir.path.string();
  const StorageInfo s = probe_storage(o);
  EXPECT_EQ(s.filesystem, "tmpfs");
  if (s.direct_io) GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT";
  EXPECT_NE(s.warning.find("O_DIRECT refused"), std::string::npos) << s.warning;
  EXPECT_EQ(s.sweep.size(), 9u);
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(Probes, GpuProbeReportsTheDeviceOrWhyThereIsNone) {
  ProbeOptions o;
  o.quick = true;
  const GpuInfo g = probe_gpu(o);
  if (!gpu::gpu_available()) {  // this machine: nvcc but no GPU, or a build without CUDA
    EXPECT_FALSE(g.present);
    EXPECT_EQ(g.reason, gpu::gpu_unavailable_reason());
    EXPECT_FALSE(g.reason.empty());
    EXPECT_EQ(g.memory, 0u);
    return;
  }
  EXPECT_TRUE(g.present) << g.reason;
  EXPECT_FALSE(g.name.empty());
  EXPECT_GT(g.memory, 0u);
  EXPECT_LE(g.free_memory, g.memory);
  EXPECT_GT(g.h2d_gbs, 0);
  EXPECT_GT(g.memory_gbs, 0);
}

const fs::path kTinyMoe = fs::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/qwen3_moe";

// The tiny MoE fixture's profile options: `prompts` prompts of at most `tokens` tokens, one thread.
ModelProfileOptions tiny_moe_options(int64_t prompts, int64_t tokens) {
  ModelProfileOptions o;
  o.max_prompts = prompts;
  o.max_tokens_per_prompt = tokens;
  o.threads = 1;
  return o;
}

TEST(ModelProfile, RouterTracesOnTheTinyMoeFixture) {
  const fs::path dir = kTinyMoe;
  ModelProfileOptions o = tiny_moe_options(4, 12);
  RouterTrace trace;
  o.trace = &trace;
  const ModelProfile p = measure_model_profile(dir, o);
  ASSERT_TRUE(p.moe());
  EXPECT_EQ(p.traced_prompts, 4);
  EXPECT_GT(p.traced_tokens, 8);
  EXPECT_EQ(trace.tokens(), p.traced_tokens);
  ASSERT_EQ(int64_t(p.expert_frequency.size()), p.moe_layers);
  for (auto& layer : p.expert_frequency) {
    double sum = 0;
    for (double f : layer) {
      EXPECT_GE(f, 0.0);
      EXPECT_LE(f, 1.0 + 1e-9);
      sum += f;
    }
    EXPECT_NEAR(sum, double(p.top_k), 1e-9);
  }
  // Each token's experts per layer are distinct (top-k without repeats).
  for (int64_t t = 0; t < trace.tokens(); ++t)
    for (int64_t l = 0; l < trace.layers; ++l) {
      std::set<int32_t> ids;
      for (int64_t j = 0; j < trace.top_k; ++j) ids.insert(trace.selections[size_t((t * trace.layers + l) * trace.top_k + j)]);
      EXPECT_EQ(int64_t(ids.size()), trace.top_k);
    }
  EXPECT_GT(p.dense_bytes(), 0u);
  EXPECT_GT(p.expert_bytes, 0u);
  EXPECT_NE(p.frequency_source.find("router traces"), std::string::npos);
  // Deterministic: the same prompts route the same way.
  RouterTrace again;
  o.trace = &again;
  measure_model_profile(dir, o);
  EXPECT_EQ(again.selections, trace.selections);
  // The fingerprint follows the files.
  EXPECT_EQ(model_fingerprint(dir, ""), p.fingerprint);
  EXPECT_NE(model_fingerprint(dir, "q8_0"), p.fingerprint);
}

// Calibrate measures the model within a memory budget (issue 14 item 1: an unpacked bf16 DeepSeek-V2-Lite was
// OOM-killed in a 4 GiB cgroup by the layers x top_k expert slots of the timing pass). With a budget that leaves
// room for only top_k slots beside the dense weights, the measurement holds the budget (ledger peak), uses fewer
// than layers x top_k slots, still times an expert, and times no decode step (every step would miss: the planner's
// analytic step instead).
TEST(ModelProfile, MeasurementHoldsItsMemoryBudget) {
  const fs::path dir = kTinyMoe;
  ModelProfileOptions o = tiny_moe_options(2, 8);
  o.timing_threads = {1};
  o.timing_seconds = 0.05;
  o.kv_quality_seconds = 0;
  ModelProfileOptions::Memory unbounded;
  o.memory = &unbounded;
  const ModelProfile p = measure_model_profile(dir, o);
  const int64_t every_step = p.moe_layers * p.top_k;
  ASSERT_EQ(unbounded.cache_slots, every_step);
  // The expert's reads as the store issues them (three dense tensors here), kept through the wisdom file's JSON.
  EXPECT_EQ(p.expert_read_extents.size(), 3u);
  EXPECT_EQ(model_profile_from_json(to_json(p)).expert_read_extents, p.expert_read_extents);
  // What the dense weights, scratch, KV and the conversion reservation took: the unbounded peak less the slots'
  // blocks and staging. The budget leaves room for top_k and a half slots beside an eighth kept free.
  const uint64_t slot = p.expert_bytes + ((p.expert_staging_bytes + 4095) / 4096) * 4096;
  const uint64_t rest = unbounded.ledger_peak - uint64_t(every_step) * slot;
  const uint64_t budget = uint64_t(double(rest + uint64_t(p.top_k) * slot + slot / 2) / (1.0 - 1.0 / 8));
  ASSERT_LT(budget, unbounded.ledger_peak);
  ModelProfileOptions::Memory bounded;
  o.memory = &bounded;
  o.memory_budget_bytes = budget;
  const ModelProfile q = measure_model_profile(dir, o);
  EXPECT_LE(bounded.ledger_peak, budget);
  EXPECT_GE(bounded.cache_slots, p.top_k);
  EXPECT_LT(bounded.cache_slots, every_step);
  ASSERT_EQ(q.timings.size(), 1u);
  EXPECT_EQ(q.timings[0].step_seconds, 0);
  EXPECT_GT(q.timings[0].expert_seconds, 0);
  EXPECT_GT(p.timings[0].step_seconds, 0);  // unbounded: every layer's top_k in memory
  EXPECT_EQ(q.traced_tokens, p.traced_tokens);
}

}  // namespace
}  // namespace tierlm::calibrate

namespace tierlm::calibrate {
namespace {

// The probes' memory: kProbeMemoryShare of the tightest of MemAvailable and (cgroup limit - usage).
TEST(ProbeLimits, MemoryBudgetIsAShareOfWhatIsUsableNow) {
  MemoryInfo m;
  m.total = 24ull << 30;
  m.available = 20ull << 30;
  EXPECT_EQ(probe_memory_budget(m), uint64_t(double(20ull << 30) * kProbeMemoryShare));
  m.cgroup_v1_limit = 3ull << 30;  // the 3 GiB group
  m.cgroup_usage = 1ull << 30;
  std::string why;
  EXPECT_EQ(probe_memory_budget(m, &why), uint64_t(double(2ull << 30) * kProbeMemoryShare));
  EXPECT_NE(why.find("cgroup limit 3072 MiB with 1024 MiB in use"), std::string::npos) << why;
  m.cgroup_v1_limit.reset();
  m.cgroup_v2_limit = 1ull << 30;
  m.cgroup_usage = 0;
  EXPECT_EQ(probe_memory_budget(m), uint64_t(double(1ull << 30) * kProbeMemoryShare));
}

// This VM's hwloc reports a 508 MiB L3 for 2 cores: clamped to kMaxCacheBytesPerCore per core, with the reason.
// Real caches stand (a 96 MiB 3D V-Cache L3 over 8 cores, a 2 MiB L2 per core).
TEST(ProbeLimits, ImplausibleCacheSizesAreClamped) {
  CacheLevel vm{3, 508ull << 20, 1};
  const std::string why = clamp_cache_level(vm, 2);
  EXPECT_EQ(vm.bytes, 2 * kMaxCacheBytesPerCore);
  EXPECT_NE(why.find("508 MiB L3 shared by 2 cores"), std::string::npos) << why;
  CacheLevel vcache{3, 96ull << 20, 2};
  EXPECT_TRUE(clamp_cache_level(vcache, 8).empty());
  EXPECT_EQ(vcache.bytes, 96ull << 20);
  CacheLevel l2{2, 2ull << 20, 2};
  EXPECT_TRUE(clamp_cache_level(l2, 1).empty());
  // Whatever hwloc says here, the topology the probes use is plausible for the cores it has.
  for (const CacheLevel& c : probe_topology().caches) EXPECT_LE(c.bytes, uint64_t(probe_topology().cores) * kMaxCacheBytesPerCore);
}

// The compute and bandwidth probes hold no more than the budget they are given (the ledger's peak is what they
// allocated; a small budget still gives numbers).
TEST(ProbeLimits, ComputeAndBandwidthProbesStayWithinTheirBudget) {
  ProbeOptions o;
  o.quick = true;
  o.seconds_per_probe = 0.3;
  o.memory_budget = 48ull << 20;
  Topology t = probe_topology();
  t.caches = {CacheLevel{3, 508ull << 20, 1}};  // as hwloc reported it before the clamp: 4x would be 2 GiB
  // OpenBLAS's own per-thread buffers are not the probe's: allocate them before the baseline.
  {
    std::vector<float> m(256 * 256, 0.5f), out(256 * 256);
    openblas_set_num_threads(t.cores);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 256, 256, 256, 1.0f, m.data(), 256, m.data(), 256, 0.0f,
                out.data(), 256);
  }
  const uint64_t before = peak_rss_bytes();
  const std::vector<ComputeSample> c = probe_compute(t, o);
  ASSERT_FALSE(c.empty());
  for (auto& s : c) {
    EXPECT_GT(s.matvec_q8_gbs, 0);
    EXPECT_GT(s.matvec_q4_gbs, 0);
    EXPECT_GT(s.matvec_f16_gbs, 0);
    EXPECT_GT(s.matvec_bf16_gbs, 0);
    EXPECT_GT(s.matvec_f32_gbs, 0);
    EXPECT_GT(s.sgemm_gflops, 0);
    for (const char* format : {"f32", "f16", "bf16", "q8_0", "q4", "mlx_q4", "mxfp4"}) {
      EXPECT_GT(s.matmul_gflops.count(format) ? s.matmul_gflops.at(format) : 0.0, 0) << format;
      EXPECT_GT(s.matmul16_gflops.count(format) ? s.matmul16_gflops.at(format) : 0.0, 0) << format;
    }
    for (const char* format : {"q4", "q8_0", "mlx_q4", "mxfp4", "bf16", "f16", "f32"})
      EXPECT_GT(s.expert_gemm_gflops.count(format) ? s.expert_gemm_gflops.at(format) : 0.0, 0) << format;
  }
  const std::vector<NodeBandwidth> b = probe_bandwidth(t, o);
  ASSERT_FALSE(b.empty());
  EXPECT_GT(b[0].read_gbs, 0);
  // Peak RSS grew by at most the budget (plus thread stacks and allocator slack).
  std::printf("peak RSS %.1f MiB before the probes, %.1f MiB after (budget %.0f MiB)\n", before / 1048576.0,
              peak_rss_bytes() / 1048576.0, o.memory_budget / 1048576.0);
  EXPECT_LE(peak_rss_bytes(), before + o.memory_budget + (32ull << 20));
}

// The model's own prefill shapes (probe_prefill): one entry per dense shape of the model, keyed by its kind,
// input width, format and threads, at 16 and 128 rows; a weight whose f32 source would take more than a quarter of
// the memory budget is probed as a slice of its rows; the whole probe stays near the seconds it is given.
// A two-layer model of 512 hidden for the prefill probes.
model::ModelConfig small_config(const char* model_type, int64_t intermediate) {
  model::ModelConfig c;
  c.model_type = model_type;
  c.arch = *model::find_architecture(model_type);
  c.vocab_size = 1000;
  c.hidden_size = 512;
  c.intermediate_size = intermediate;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  return c;
}

TEST(ProbeLimits, PrefillShapeProbeIsKeyedByShapeAndBounded) {
  const model::ModelConfig c = small_config("llama", 4096);
  const ModelProfile m = model_profile_from_config(c, kernels::WeightFormat::f16, kernels::WeightFormat::f16);
  ProbeOptions o;
  o.seconds_per_probe = 0.4;
  o.memory_budget = 8ull << 20;
  const auto start = std::chrono::steady_clock::now();
  const PrefillRates rates = probe_prefill(m, 2, "f32", o);
  const std::vector<PrefillGemm>& gemms = rates.gemms;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<GemmShape> shapes = m.dense_gemm_shapes();
  ASSERT_EQ(shapes.size(), 4u);  // qkv, o, gate_up, down
  ASSERT_EQ(gemms.size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const PrefillGemm& g = gemms[i];
    EXPECT_EQ(g.kind, shapes[i].kind);
    EXPECT_EQ(g.in, shapes[i].in);
    EXPECT_EQ(g.format, "f16");
    EXPECT_EQ(g.threads, 2);
    EXPECT_EQ(g.rows, (std::vector<int64_t>{16, 128}));
    for (double r : g.gflops) EXPECT_GT(r, 0) << g.kind;
    EXPECT_LE(uint64_t(g.out * g.in) * 4, o.memory_budget / 4) << g.kind;
    if (uint64_t(shapes[i].out * shapes[i].in) * 4 <= o.memory_budget / 4) EXPECT_EQ(g.out, shapes[i].out) << g.kind;
    else EXPECT_LT(g.out, shapes[i].out) << g.kind;
  }
  EXPECT_EQ(gemms[2].kind, "gate_up");
  EXPECT_LT(gemms[2].out, shapes[2].out);  // [8192 x 512] in f32 is 16 MiB: sliced
  EXPECT_EQ(gemms[0].out, shapes[0].out);  // qkv [768 x 512]: whole
  EXPECT_GT(rates.gate_seconds, 0);  // the per-row work, seconds per element
  EXPECT_GT(rates.row_seconds, 0);
  EXPECT_GT(rates.attention_seconds, 0);  // attention as the engine runs it, at the probe's threads and KV codec
  EXPECT_LT(rates.attention_seconds, 1e-6);  // seconds per head-position: nanoseconds
  EXPECT_EQ(rates.attention_threads, 2);
  EXPECT_EQ(rates.attention_codec, "f32");
  EXPECT_LT(seconds, 3.0);  // 0.4 s of timing, at least two calls a cell (slack for a loaded 2-core VM)
}

}  // namespace
}  // namespace tierlm::calibrate

namespace tierlm::calibrate {
namespace {

// An MoE model's own experts on the engine's lanes (probe_prefill): its hidden x expert intermediate in its expert
// format, as many rows each as a 128-row chunk gives them (128 x top_k over the experts), at the probe's threads.
TEST(ProbeLimits, PrefillProbeTimesAnMoeModelsOwnExperts) {
  model::ModelConfig c = small_config("qwen3_moe", 1024);
  c.num_experts = 12;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 256;
  const ModelProfile m = model_profile_from_config(c, kernels::WeightFormat::f32, kernels::WeightFormat::q4);
  ProbeOptions o;
  o.seconds_per_probe = 0.2;
  o.memory_budget = 32ull << 20;
  const PrefillRates rates = probe_prefill(m, 2, "f32", o);
  EXPECT_GT(rates.expert_gflops, 0);
  EXPECT_LT(rates.expert_gflops, 1e5);  // GFLOP/s of a 2-thread probe: far below 100 TFLOP/s
  EXPECT_EQ(rates.expert_threads, 2);
  EXPECT_EQ(rates.expert_rows, 22);  // ceil(128 x 2 / 12)
  EXPECT_EQ(rates.expert_format, "q4");
  // A dense model has none.
  const model::ModelConfig dense = small_config("llama", 1024);
  const PrefillRates none =
      probe_prefill(model_profile_from_config(dense, kernels::WeightFormat::f32, kernels::WeightFormat::f32), 2, "f32", o);
  EXPECT_EQ(none.expert_gflops, 0);
  EXPECT_EQ(none.expert_threads, 0);
}

}  // namespace
}  // namespace tierlm::calibrate
