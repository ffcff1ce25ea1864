// The wisdom file: round trip, XDG default location, lookups that tell stale or foreign wisdom apart, and durability:
// concurrent writers (processes and threads) all land their entries, a kill -9 mid-write leaves the old or the new
// file, every kind of corrupt file is a clear error naming the file and the fix, and writers move it aside.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "calibrate/wisdom.h"

namespace tierlm::calibrate {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tierlm-wisdom-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

WisdomEntry entry_for(const fs::path& model_dir) {
  WisdomEntry e;
  e.device = load_device_profile(std::string(TIERLM_SOURCE_DIR) + "/profiles/devices/desktop-16gb.json");
  e.device.compute.front().matmul_gflops = {{"f16", 250.5}, {"q4", 180.25}};  // the engine's prefill GEMM probe
  e.device.compute.front().matmul16_gflops = {{"f16", 120.5}};
  e.device.compute.front().expert_gemm_gflops = {{"q4", 88.25}, {"mxfp4", 41.5}};
  e.device.compute.front().matvec_f32_gbs = 33.5;
  model::ModelConfig c;
  c.model_type = "llama";
  c.arch = *model::find_architecture("llama");
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  e.model = model_profile_from_config(c, kernels::WeightFormat::f32, kernels::WeightFormat::f32);
  e.model.path = fs::absolute(model_dir).string();
  e.model.fingerprint = "model-v1";
  e.plan = make_plan(e.device, e.model, {});
  e.created_at = "2026-01-01T00:00:00Z";
  return e;
}

TEST(Wisdom, RoundTripsThroughTheFile) {
  TempDir dir;
  const fs::path file = dir.path / "sub" / "wisdom.json";
  EXPECT_TRUE(load_wisdom(file).entries.empty());  // missing file: empty wisdom
  Wisdom w;
  w.upsert(entry_for(dir.path / "model"));
  save_wisdom(file, w);
  const Wisdom back = load_wisdom(file);
  ASSERT_EQ(back.entries.size(), 1u);
  // Boost.JSON 1.81 parses doubles to within an ulp, not bit-exactly: decisions must match exactly, numbers closely.
  const Plan& a = w.entries[0].plan;
  const Plan& b = back.entries[0].plan;
  EXPECT_EQ(b.device_fingerprint, a.device_fingerprint);
  EXPECT_EQ(b.model_fingerprint, a.model_fingerprint);
  EXPECT_EQ(b.budget_bytes, a.budget_bytes);
  EXPECT_EQ(b.threads, a.threads);
  EXPECT_EQ(b.kv_codec, a.kv_codec);
  EXPECT_EQ(b.prefill_chunk, a.prefill_chunk);
  EXPECT_EQ(b.prediction.memory, a.prediction.memory);
  EXPECT_NEAR(b.prediction.decode_tokens_per_second, a.prediction.decode_tokens_per_second,
              1e-12 * a.prediction.decode_tokens_per_second);
  EXPECT_EQ(b.rationale.size(), a.rationale.size());
  EXPECT_EQ(back.entries[0].device.fingerprint(), w.entries[0].device.fingerprint());
  EXPECT_EQ(back.entries[0].device.compute.front().matmul_gflops, w.entries[0].device.compute.front().matmul_gflops);
  EXPECT_EQ(back.entries[0].device.compute.front().matmul16_gflops,
            w.entries[0].device.compute.front().matmul16_gflops);
  EXPECT_EQ(back.entries[0].device.compute.front().expert_gemm_gflops,
            w.entries[0].device.compute.front().expert_gemm_gflops);
  EXPECT_EQ(back.entries[0].device.compute.front().matvec_f32_gbs, 33.5);
  EXPECT_EQ(back.entries[0].model.classes.size(), w.entries[0].model.classes.size());
  // Upsert replaces the entry of the same device and model path.
  Wisdom again = back;
  again.upsert(entry_for(dir.path / "model"));
  EXPECT_EQ(again.entries.size(), 1u);
  again.upsert(entry_for(dir.path / "other-model"));
  EXPECT_EQ(again.entries.size(), 2u);
}

TEST(Wisdom, DefaultPathFollowsXdgCacheHome) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(default_wisdom_path(), fs::path("/tmp/xdg-test/tierlm/wisdom.json"));
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(default_wisdom_path(), fs::path(home) / ".cache/tierlm/wisdom.json");
  }
  if (old) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST(Wisdom, LookupFindsOrExplainsWhyNot) {
  TempDir dir;
  const fs::path model = dir.path / "model";
  fs::create_directories(model);
  Wisdom w;
  w.upsert(entry_for(model));
  const DeviceProfile& same_machine = w.entries[0].device;
  const fs::path file = dir.path / "wisdom.json";

  auto found = find_wisdom(w, same_machine, model, "model-v1", file);
  EXPECT_EQ(found.status, WisdomLookup::Status::found);
  ASSERT_NE(found.entry, nullptr);

  auto changed = find_wisdom(w, same_machine, model, "model-v2", file);
  EXPECT_EQ(changed.status, WisdomLookup::Status::model_changed);
  EXPECT_NE(changed.message.find("changed since"), std::string::npos) << changed.message;
  EXPECT_NE(changed.message.find("tierlm calibrate --model"), std::string::npos) << changed.message;

  DeviceProfile other = same_machine;
  other.topology.cores = 64;
  other.topology.threads = 128;
  auto foreign = find_wisdom(w, other, model, "model-v1", file);
  EXPECT_EQ(foreign.status, WisdomLookup::Status::hardware_changed);
  EXPECT_NE(foreign.message.find("other hardware"), std::string::npos) << foreign.message;
  EXPECT_NE(foreign.message.find("64 cores"), std::string::npos) << foreign.message;

  DeviceProfile more_memory = same_machine;
  more_memory.memory.total *= 2;
  EXPECT_EQ(find_wisdom(w, more_memory, model, "model-v1", file).status, WisdomLookup::Status::hardware_changed);
  // Free memory and measurements are not identity: they may change without invalidating the wisdom.
  DeviceProfile busier = same_machine;
  busier.memory.available /= 2;
  busier.bandwidth.clear();
  EXPECT_EQ(find_wisdom(w, busier, model, "model-v1", file).status, WisdomLookup::Status::found);

  auto missing = find_wisdom(w, same_machine, dir.path / "unknown", "x", file);
  EXPECT_EQ(missing.status, WisdomLookup::Status::missing);
  EXPECT_NE(missing.message.find("no wisdom"), std::string::npos);
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// Files in dir whose name starts with prefix.
std::vector<fs::path> files_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> found;
  for (auto& f : fs::directory_iterator(dir))
    if (f.path().filename().string().rfind(prefix, 0) == 0) found.push_back(f.path());
  return found;
}

// Waits for a forked child; its exit code, or 128 + the signal that ended it.
int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Wisdom, ConcurrentProcessesAllLandTheirEntries) {
  TempDir dir;
  const fs::path file = dir.path / "cache" / "wisdom.json";  // the directory is created by whichever writer is first
  constexpr int kProcesses = 6, kEntriesEach = 5;
  const WisdomEntry base = entry_for(dir.path / "model");
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        for (int i = 0; i < kEntriesEach; ++i) {
          WisdomEntry e = base;
          e.model.path = fmt::format("/models/process-{}-entry-{}", p, i);
          update_wisdom(file, [&](Wisdom& w) { w.upsert(e); });
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer %d: %s\n", p, e.what());
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) EXPECT_EQ(wait_child(pid), 0);
  const Wisdom back = load_wisdom(file);
  std::set<std::string> paths;
  for (auto& e : back.entries) paths.insert(e.model.path);
  EXPECT_EQ(back.entries.size(), size_t(kProcesses * kEntriesEach));
  for (int p = 0; p < kProcesses; ++p)
    for (int i = 0; i < kEntriesEach; ++i)
      EXPECT_TRUE(paths.count(fmt::format("/models/process-{}-entry-{}", p, i))) << p << "/" << i;
  EXPECT_TRUE(files_starting(file.parent_path(), "wisdom.json.tmp.").empty());
  EXPECT_TRUE(fs::exists(dir.path / "cache" / "wisdom.json.lock"));
}

TEST(Wisdom, ConcurrentThreadsAllLandTheirEntries) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  constexpr int kThreads = 4, kEntriesEach = 5;
  const WisdomEntry base = entry_for(dir.path / "model");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kEntriesEach; ++i) {
          WisdomEntry e = base;
          e.model.path = fmt::format("/models/thread-{}-entry-{}", t, i);
          update_wisdom(file, [&](Wisdom& w) { w.upsert(e); });
        }
      } catch (const std::exception&) {
        ++failures;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(load_wisdom(file).entries.size(), size_t(kThreads * kEntriesEach));
}

// A child rewrites a large file in a loop (alternating two versions) and is killed with SIGKILL at random moments:
// after every kill the file parses and is wholly one version or the other; temporary files it leaves are ignored by
// readers and removed by the next writer.
TEST(Wisdom, KillNineMidWriteLeavesTheOldOrTheNewFile) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  constexpr size_t kEntries = 150;
  Wisdom versions[2];
  for (int v = 0; v < 2; ++v)
    for (size_t i = 0; i < kEntries + size_t(v); ++i) {
      WisdomEntry e = entry_for(dir.path / fmt::format("model-{}", i));
      e.created_at = v == 0 ? "old" : "new";
      versions[v].entries.push_back(std::move(e));
    }
  // Kills land over the first three writes whatever this build's speed (sanitizers make a write ~10x slower): in
  // the first the old version stays, after the second it is new, after the third old again.
  const auto t0 = std::chrono::steady_clock::now();
  save_wisdom(file, versions[1]);
  save_wisdom(file, versions[0]);
  const auto one_write = (std::chrono::steady_clock::now() - t0) / 2;
  const int max_delay_us = int(std::chrono::duration_cast<std::chrono::microseconds>(3 * one_write).count()) + 1000;
  const uintmax_t bytes = fs::file_size(file);
  RecordProperty("file_bytes", std::to_string(bytes));

  std::mt19937 random(12345);
  constexpr int kKills = 40;
  int kills_leaving_temp = 0, seen[2] = {0, 0}, k = 0;
  // A loaded machine can stretch the child's writes well past the measured one: while no kill has yet landed after
  // a whole write, more kills follow with longer delays (up to 3x the count), so the coverage check below stays a
  // check of the writer, not of the machine's load.
  for (; k < kKills || (seen[1] == 0 && k < 3 * kKills); ++k) {
    const int bound = k < kKills ? max_delay_us : max_delay_us * (2 + (k - kKills) / 5);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (uint64_t n = 1;; ++n) save_wisdom(file, versions[n % 2]);  // never returns: killed
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, bound)(random)));
    ::kill(pid, SIGKILL);
    EXPECT_EQ(wait_child(pid), 128 + SIGKILL);
    if (!files_starting(dir.path, "wisdom.json.tmp.").empty()) ++kills_leaving_temp;
    Wisdom w;
    ASSERT_NO_THROW(w = load_wisdom(file)) << "after kill " << k;
    ASSERT_TRUE(w.entries.size() == kEntries || w.entries.size() == kEntries + 1) << w.entries.size();
    const int version = w.entries.size() == kEntries ? 0 : 1;
    ++seen[version];
    for (auto& e : w.entries) ASSERT_EQ(e.created_at, version == 0 ? "old" : "new") << "a mix of two versions";
  }
  std::printf("file of %ju bytes, one write %.1f ms, %d kills: %d left a temporary file; the file was the old version "
              "%d times, the new %d times\n",
              bytes, std::chrono::duration<double, std::milli>(one_write).count(), k, kills_leaving_temp, seen[0],
              seen[1]);
  EXPECT_GT(seen[1], 0) << "no kill landed after a whole write: the kills did not cover the writes";
  RecordProperty("kills_leaving_temp", kills_leaving_temp);
  // A temporary file planted by hand stands for one a kill left, in case no kill landed inside a write.
  write_bytes(dir.path / "wisdom.json.tmp.99999.0.00000000deadbeef", "{\"partial");
  EXPECT_NO_THROW(load_wisdom(file));
  update_wisdom(file, [](Wisdom&) {});
  EXPECT_TRUE(files_starting(dir.path, "wisdom.json.tmp.").empty());
}

struct CorruptCase {
  std::string name, bytes, expect;  // expect: what the message must say is wrong
};

std::vector<CorruptCase> corrupt_cases(const std::string& valid) {
  std::string binary(256, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = char((i * 37 + 11) % 256);
  auto replace = [&](const std::string& from, const std::string& to, bool last = false) {
    std::string s = valid;
    const size_t at = last ? s.rfind(from) : s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  return {
      {"empty", "", "empty (0 bytes)"},
      {"whitespace", "  \n", "truncated JSON"},
      {"truncated", valid.substr(0, valid.size() / 2), "truncated JSON"},
      {"binary", binary, "binary data"},
      {"not json", "{not json", "not valid JSON"},
      {"bad utf-8", "{\"schema\":\"tierlm-wis\xff\xfe" "dom\"}", "not valid JSON"},
      {"trailing garbage", valid + "}}", "not valid JSON"},
      {"array", "[]", "expected a JSON object"},
      {"another file", R"({"hello":"world"})", "missing field 'schema'"},
      {"other schema", R"({"schema":"llama-cache","schema_version":1,"entries":[]})", "not a tierlm wisdom file"},
      {"future version", R"({"schema":"tierlm-wisdom","schema_version":99,"entries":[]})", "schema version 99"},
      {"version as string", replace("\"schema_version\":1,\"entries\"", "\"schema_version\":\"1\",\"entries\""),
       "'schema_version' must be an integer"},
      {"entries not array", R"({"schema":"tierlm-wisdom","schema_version":1,"entries":{}})", "must be an array"},
      {"empty entry", R"({"schema":"tierlm-wisdom","schema_version":1,"entries":[{"device":{}}]})", "entry 0"},
      {"threads as string", replace("\"threads\":", "\"threads\":\"four\",\"was\":"), "'threads' must be an integer"},
      {"plan memory as string", replace("\"memory\":{\"", "\"memory\":{\"bogus\":\"x\",\"", true), "entry 0"},
  };
}

TEST(Wisdom, EveryKindOfCorruptFileIsAClearError) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  Wisdom w;
  w.upsert(entry_for(dir.path / "model"));
  save_wisdom(file, w);
  const std::string valid = read_bytes(file);
  for (const CorruptCase& c : corrupt_cases(valid)) {
    SCOPED_TRACE(c.name);
    write_bytes(file, c.bytes);
    for (const fs::path& model : {fs::path(), fs::path("/models/tiny")}) {
      try {
        load_wisdom(file, model);
        ADD_FAILURE() << "no error";
      } catch (const CorruptWisdomError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("wisdom file " + file.string() + " is corrupt"), std::string::npos) << m;
        EXPECT_NE(m.find(c.expect), std::string::npos) << m;
        const std::string command = "`tierlm calibrate --model " + (model.empty() ? "DIR" : model.string()) +
                                    " --wisdom " + file.string() + "`";
        EXPECT_NE(m.find(command), std::string::npos) << m;
        EXPECT_NE(m.find("or delete " + file.string()), std::string::npos) << m;
        EXPECT_EQ(e.path(), file);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not a CorruptWisdomError: " << e.what();
      }
    }
    EXPECT_EQ(read_bytes(file), c.bytes) << "reading must not change the file";
  }
}

TEST(Wisdom, WritersMoveACorruptFileAsideInsteadOfOverwritingIt) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  const std::string garbage = "{\"schema\":\"tierlm-wisdom\",\"schema_ver";
  write_bytes(file, garbage);
  const Wisdom written = update_wisdom(file, [&](Wisdom& w) { w.upsert(entry_for(dir.path / "model")); });
  EXPECT_EQ(written.entries.size(), 1u);
  EXPECT_EQ(load_wisdom(file).entries.size(), 1u);
  auto aside = files_starting(dir.path, "wisdom.json.corrupt-");
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(read_bytes(aside[0]), garbage);
  // Again within the same second: a second name, the first kept.
  write_bytes(file, "");
  save_wisdom(file, written);  // save replaces whole files: no merge, nothing moved
  EXPECT_EQ(files_starting(dir.path, "wisdom.json.corrupt-").size(), 1u);
  write_bytes(file, "\x01\x02");
  update_wisdom(file, [](Wisdom&) {});
  write_bytes(file, "\x03");
  update_wisdom(file, [](Wisdom&) {});
  aside = files_starting(dir.path, "wisdom.json.corrupt-");
  ASSERT_EQ(aside.size(), 3u);
  std::set<std::string> contents;
  for (auto& f : aside) contents.insert(read_bytes(f));
  EXPECT_EQ(contents, (std::set<std::string>{garbage, "\x01\x02", "\x03"}));
}

TEST(Wisdom, AFileThatCannotBeReadIsNeitherMissingNorReplaced) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  fs::create_directories(file);  // a directory where the file should be
  try {
    load_wisdom(file);
    FAIL() << "no error";
  } catch (const CorruptWisdomError& e) {
    FAIL() << "a directory is not corrupt wisdom to move aside: " << e.what();
  } catch (const WisdomError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(update_wisdom(file, [](Wisdom&) {}), WisdomError);
  EXPECT_TRUE(fs::is_directory(file));
  EXPECT_TRUE(files_starting(dir.path, "wisdom.json.corrupt-").empty());
}

}  // namespace
}  // namespace tierlm::calibrate
