// The wisdom file: round trip, XDG default location, and lookups that tell stale or foreign wisdom apart.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <boost/json.hpp>

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

TEST(Wisdom, CorruptOrFutureFilesAreClearErrors) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  std::ofstream(file) << "{not json";
  try {
    load_wisdom(file);
    FAIL();
  } catch (const WisdomError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  std::ofstream(file) << R"({"schema":"tierlm-wisdom","schema_version":99,"entries":[]})";
  try {
    load_wisdom(file);
    FAIL();
  } catch (const WisdomError& e) {
    EXPECT_NE(std::string(e.what()).find("schema version 99"), std::string::npos) << e.what();
  }
  std::ofstream(file) << R"({"schema":"tierlm-wisdom","schema_version":1,"entries":[{"device":{}}]})";
  EXPECT_THROW(load_wisdom(file), WisdomError);
}

}  // namespace
}  // namespace tierlm::calibrate
