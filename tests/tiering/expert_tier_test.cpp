// ExpertReader, ExpertStore and ExpertCache against exact oracles: bytes read equal the file's bytes (O_DIRECT,
// split into blocks, several in flight, and the buffered fallback on ramfs, which refuses O_DIRECT); MLX stacked
// switch_mlp slices equal per-expert MLX tensors, and a miss repacks them into the slot exactly with no scratch; LRU and frequency-aware eviction pick the victims the policy says.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/model/moe_model.h"
#include "tests/runtime/model/safetensors_writer.h"
#include "tests/tiering/packed_experts_fixture.h"
#include "tiering/expert_cache.h"

using namespace tierlm;

namespace {

using test::random_bytes;

void check_reads(const std::filesystem::path& file, const std::string& bytes, bool expect_direct) {
  tiering::ReaderOptions o;
  o.queue_depth = 3;
  o.block_size = 8192;  // forces splitting
  tiering::ExpertReader reader({file.string()}, o);
  EXPECT_EQ(reader.direct(0), expect_direct);
  tiering::Ledger ledger;
  tiering::LedgerBuffer buf(ledger, "test", 64 * 4096, 4096);
  // Several aligned requests in flight, one running past the end of the file.
  std::vector<tiering::ReadRequest> reads = {{0, 4096, 5 * 4096, buf.as<char>()},
                                             {0, 40 * 4096, 12 * 4096, buf.as<char>() + 8 * 4096},
                                             {0, (bytes.size() / 4096) * 4096, 4 * 4096, buf.as<char>() + 24 * 4096}};
  reader.wait(reader.submit(reads));
  EXPECT_EQ(std::memcmp(buf.as<char>(), bytes.data() + 4096, 5 * 4096), 0);
  EXPECT_EQ(std::memcmp(buf.as<char>() + 8 * 4096, bytes.data() + 40 * 4096, 12 * 4096), 0);
  const size_t tail = bytes.size() % 4096;
  EXPECT_EQ(std::memcmp(buf.as<char>() + 24 * 4096, bytes.data() + bytes.size() - tail, tail), 0);
  EXPECT_EQ(reader.stats().bytes_read, uint64_t(17 * 4096 + tail));
  EXPECT_GE(reader.stats().reads, 5u);  // 5 blocks of 8 KiB for the first two requests alone
}

TEST(ExpertReader, DirectReadsSplitIntoBlocks) {
  test::TempDir dir;
  const std::string bytes = random_bytes(60 * 4096 + 1000, 1);
  test::write_file(dir / "f.bin", bytes);
  check_reads(dir / "f.bin", bytes, true);
}

TEST(ExpertReader, FallsBackToBufferedWhereODirectIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "skipped: mounting ramfs (which refuses O_DIRECT) needs root";
  test::TempDir dir;
  const auto mount_point = dir / "ramfs";
  std::filesystem::create_directory(mount_point);
  if (mount("ramfs", mount_point.c_str(), "ramfs", 0, nullptr) != 0)
    GTEST_SKIP() << "skipped: cannot mount ramfs here (" << std::strerror(errno) << ")";
  const std::string bytes = random_bytes(60 * 4096 + 1000, 2);
  test::write_file(mount_point / "f.bin", bytes);
  check_reads(mount_point / "f.bin", bytes, false);
  umount(mount_point.c_str());
}

TEST(ExpertReader, RejectsUnalignedDirectReads) {
  test::TempDir dir;
  test::write_file(dir / "f.bin", random_bytes(8192, 3));
  tiering::ExpertReader reader({(dir / "f.bin").string()});
  ASSERT_TRUE(reader.direct(0));
  tiering::Ledger ledger;
  tiering::LedgerBuffer buf(ledger, "test", 8192, 4096);
  const tiering::ReadRequest r{0, 100, 4096, buf.data()};
  EXPECT_THROW(reader.submit(std::span(&r, 1)), tiering::ReaderError);
}

// One layer of 4 MLX 4-bit experts (H = I = 64, group 32), written both stacked (switch_mlp) and per expert.
model::ModelConfig mlx_config() {
  model::ModelConfig c;
  c.model_type = "qwen3_moe";
  c.arch = *model::find_architecture("qwen3_moe");
  c.num_layers = 1;
  c.hidden_size = 64;
  c.moe_intermediate_size = 64;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.quantization = model::QuantizationConfig{32, 4, {}};
  return c;
}

// One MLX projection stacked over E experts: uint32 codes, f16 scales in [0.5, 1) and biases in (-1, -0.5], group 32.
struct MlxProjection {
  std::string name;
  int64_t rows, cols;
  std::string words, scales, biases;
};

std::vector<MlxProjection> mlx_projections(int64_t E, int64_t H, int64_t I) {
  std::vector<MlxProjection> out;
  uint64_t seed = 10;
  for (auto [name, rows, cols] : {std::tuple{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}}) {
    MlxProjection p{name, rows, cols, random_bytes(size_t(E * rows * cols / 2), seed++), {}, {}};
    p.scales.assign(size_t(E * rows * cols / 32) * 2, '\0');
    p.biases = p.scales;
    for (size_t i = 0; i < p.scales.size(); i += 2) {
      p.scales[i + 1] = 0x38;
      p.scales[i] = char(i);
      p.biases[i + 1] = char(0xB8);
      p.biases[i] = char(i * 3);
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<uint8_t> slice(const std::string& x, size_t from, size_t n) {
  return std::vector<uint8_t>(x.begin() + from, x.begin() + from + n);
}

std::vector<test::TestTensor> stacked_tensors(const std::vector<MlxProjection>& projections, int64_t E) {
  std::vector<test::TestTensor> out;
  for (const MlxProjection& p : projections) {
    const std::string base = "model.layers.0.mlp.switch_mlp." + p.name;
    out.push_back({base + ".weight", "U32", {E, p.rows, p.cols / 8}, slice(p.words, 0, p.words.size())});
    out.push_back({base + ".scales", "F16", {E, p.rows, p.cols / 32}, slice(p.scales, 0, p.scales.size())});
    out.push_back({base + ".biases", "F16", {E, p.rows, p.cols / 32}, slice(p.biases, 0, p.biases.size())});
  }
  return out;
}

// f16 (normal numbers only, as the fixture's scales and biases are) to float, as IEEE defines it.
float f16_value(const std::string& bytes, size_t index) {
  const unsigned h = uint8_t(bytes[2 * index]) | unsigned(uint8_t(bytes[2 * index + 1])) << 8;
  const float magnitude = std::ldexp(1.0f + float(h & 0x3FF) / 1024.0f, int((h >> 10) & 0x1F) - 15);
  return h & 0x8000 ? -magnitude : magnitude;
}

TEST(ExpertStore, MlxSwitchMlpSlicesEqualPerExpertTensors) {
  const auto c = mlx_config();
  const int64_t E = 4, H = 64, I = 64;
  const auto projections = mlx_projections(E, H, I);
  std::vector<test::TestTensor> stacked = stacked_tensors(projections, E), per_expert;
  for (const MlxProjection& p : projections) {
    for (int64_t e = 0; e < E; ++e) {
      const std::string pe = "model.layers.0.mlp.experts." + std::to_string(e) + "." + p.name;
      const size_t wn = p.words.size() / E, sn = p.scales.size() / E;
      per_expert.push_back({pe + ".weight", "U32", {p.rows, p.cols / 8}, slice(p.words, size_t(e) * wn, wn)});
      per_expert.push_back({pe + ".scales", "F16", {p.rows, p.cols / 32}, slice(p.scales, size_t(e) * sn, sn)});
      per_expert.push_back({pe + ".biases", "F16", {p.rows, p.cols / 32}, slice(p.biases, size_t(e) * sn, sn)});
    }
  }
  test::TempDir dir;
  test::write_bytes(dir / "stacked.safetensors", test::build_file(stacked));
  test::write_bytes(dir / "per_expert.safetensors", test::build_file(per_expert));
  const auto a_index = model::TensorIndex::open_file(dir / "stacked.safetensors");
  const auto b_index = model::TensorIndex::open_file(dir / "per_expert.safetensors");
  const auto a = model::expert_store_from_safetensors(a_index, c, std::nullopt);
  const auto b = model::expert_store_from_safetensors(b_index, c, std::nullopt);
  ASSERT_EQ(a.encoding(), tiering::ExpertEncoding::mlx);
  ASSERT_EQ(a.layout().format, kernels::WeightFormat::mlx_q4);
  ASSERT_EQ(a.layout().bytes, b.layout().bytes);
  tiering::Ledger ledger;
  tiering::ExpertReader ra(a.files()), rb(b.files());
  tiering::LedgerBuffer sa(ledger, "t", a.staging_bytes(), 4096), sb(ledger, "t", b.staging_bytes(), 4096);
  tiering::LedgerBuffer ba(ledger, "t", a.layout().bytes, 4096), bb(ledger, "t", b.layout().bytes, 4096);
  for (int64_t e = 0; e < E; ++e) {
    std::memset(ba.data(), 0, ba.size());
    std::memset(bb.data(), 0, bb.size());
    ra.wait(ra.submit(a.plan(0, e, ba.data(), sa.data())));
    a.finish(0, e, sa.data(), ba.data(), ledger);
    rb.wait(rb.submit(b.plan(0, e, bb.data(), sb.data())));
    b.finish(0, e, sb.data(), bb.data(), ledger);
    EXPECT_EQ(std::memcmp(ba.data(), bb.data(), ba.size()), 0) << "expert " << e;
  }
}

// A miss repacks the nine MLX extents from the staging block straight into the slot: every weight of gate, up and
// down dequantizes to scale * code + bias of the file's own bytes (exact), over a slot holding another expert's
// bytes before, and no scratch is charged (the store reserves none).
TEST(ExpertStore, MlxMissRepacksIntoTheSlotExactlyWithoutScratch) {
  const auto c = mlx_config();
  const int64_t E = 4, H = 64, I = 64;
  const auto projections = mlx_projections(E, H, I);
  test::TempDir dir;
  test::write_bytes(dir / "stacked.safetensors", test::build_file(stacked_tensors(projections, E)));
  const auto index = model::TensorIndex::open_file(dir / "stacked.safetensors");
  const auto store = model::expert_store_from_safetensors(index, c, std::nullopt);
  EXPECT_EQ(store.conversion_bytes(), 0u);
  tiering::Ledger ledger;
  tiering::ExpertReader reader(store.files());
  tiering::LedgerBuffer staging(ledger, "t", store.staging_bytes(), 4096);
  tiering::LedgerBuffer block(ledger, "t", store.layout().bytes, 4096);
  std::memset(block.data(), 0xAB, block.size());
  tiering::Ledger scratch;
  std::vector<float> row(size_t(std::max(H, I)));
  for (int64_t e = E - 1; e >= 0; --e) {
    reader.wait(reader.submit(store.plan(0, e, block.data(), staging.data())));
    store.finish(0, e, staging.data(), block.data(), scratch);
    EXPECT_EQ(scratch.peak(), 0u);
    const tiering::ExpertViews v = store.layout().views(block.data());
    for (int m = 0; m < 3; ++m) {
      const MlxProjection& p = projections[size_t(m)];
      const kernels::WeightView& w = m == 2 ? v.down : v.gate_up;
      const int64_t row0 = m == 1 ? I : 0;
      for (int64_t r = 0; r < p.rows; ++r) {
        kernels::dequantize_row(w, row0 + r, row.data());
        for (int64_t col = 0; col < p.cols; ++col) {
          const int64_t element = (e * p.rows + r) * p.cols + col;
          const uint8_t byte = uint8_t(p.words[size_t(element / 2)]);
          const int code = element % 2 ? byte >> 4 : byte & 0x0F;
          const size_t group = size_t((e * p.rows + r) * (p.cols / 32) + col / 32);
          const float want = f16_value(p.scales, group) * float(code) + f16_value(p.biases, group);
          ASSERT_FLOAT_EQ(row[size_t(col)], want) << p.name << " expert " << e << " row " << r << " col " << col;
        }
      }
    }
  }
}

// gpt-oss's MXFP4 experts (the transformers fixture's file): the cache reserves in "expert_staging" what a miss's
// conversion really charges, measured on a scratch ledger's peak. Into an MXFP4 slot the blocks and scales go
// straight from staging into the slot, so only the bias temporaries remain; into a q8_0 slot (widened) the
// reservation still covers the peak.
TEST(ExpertStore, Mxfp4ReservationIsWhatTheMissPathCharges) {
  const std::filesystem::path dir = std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/gpt_oss-mxfp4";
  const auto config = model::load_config(dir);
  const auto index = model::TensorIndex::open_file(dir / "model.safetensors");
  for (const auto format : {kernels::WeightFormat::mxfp4, kernels::WeightFormat::q8_0}) {
    const auto store = model::expert_store_from_safetensors(index, config, format);
    ASSERT_EQ(store.encoding(), tiering::ExpertEncoding::mxfp4);
    ASSERT_EQ(store.layout().format, format);
    tiering::Ledger ledger;
    tiering::ExpertReader reader(store.files());
    tiering::LedgerBuffer staging(ledger, "t", store.staging_bytes(), 4096);
    tiering::LedgerBuffer block(ledger, "t", store.layout().bytes, 4096);
    tiering::Ledger scratch;
    for (int64_t e = 0; e < store.experts(); ++e) {
      reader.wait(reader.submit(store.plan(0, e, block.data(), staging.data())));
      store.finish(0, e, staging.data(), block.data(), scratch);
    }
    EXPECT_GT(scratch.peak(), 0u);
    EXPECT_GE(store.conversion_bytes(), scratch.peak()) << kernels::format_name(format);
    if (format == kernels::WeightFormat::mxfp4) {
      EXPECT_EQ(store.conversion_bytes(), scratch.peak());  // nothing reserved that the miss path does not use
    }
    // The cache charges exactly that reservation to its ledger.
    tiering::Ledger cache_ledger;
    tiering::ExpertCacheOptions o;
    o.slots = 2;
    o.prefetch_limit = 0;
    tiering::ExpertCache cache(store, reader, cache_ledger, o);
    EXPECT_EQ(cache_ledger.used("expert_staging"), store.conversion_bytes());
  }
}

using CacheFixture = test::PackedExperts;

TEST(ExpertCache, LruEvictsTheLeastRecentlyUsed) {
  CacheFixture f;
  tiering::ExpertCacheOptions o;
  o.slots = 2;
  o.resident = {{0, 5}};
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  EXPECT_EQ(f.ledger.used(tiering::accounts::expert_cache), 2 * f.store->layout().bytes);
  EXPECT_EQ(f.ledger.used(tiering::accounts::resident_experts), f.store->layout().bytes);
  for (int32_t e : {0, 1, 0, 0, 0, 2}) f.use(cache, e);  // 2 evicts 1 (least recent), although 0 is older
  EXPECT_TRUE(cache.cached(0, 0));
  EXPECT_FALSE(cache.cached(0, 1));
  f.use(cache, 5);
  const auto t = cache.telemetry();
  EXPECT_EQ(t.misses, 3u);
  EXPECT_EQ(t.hits, 4u);
  EXPECT_EQ(t.resident_hits, 1u);
  EXPECT_EQ(t.bytes_read, 3 * f.store->layout().bytes);  // the misses; the resident load predates the counters
}

TEST(ExpertCache, FrequencyKeepsTheOftenUsed) {
  CacheFixture f;
  tiering::ExpertCacheOptions o;
  o.slots = 2;
  o.policy = tiering::CachePolicy::frequency;
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  for (int32_t e : {0, 0, 0, 1, 2}) f.use(cache, e);  // 2 evicts 1 (used once), not 0 (used 3 times)
  EXPECT_TRUE(cache.cached(0, 0));
  EXPECT_FALSE(cache.cached(0, 1));
  EXPECT_TRUE(cache.cached(0, 2));
}

TEST(ExpertCache, PinnedExpertsAreNeverEvictedAndPrefetchIsCounted) {
  CacheFixture f;
  tiering::ExpertCacheOptions o;
  o.slots = 2;
  o.prefetch_limit = 1;
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  const int32_t two[2] = {0, 1};
  cache.request(0, two);
  const int32_t third = 2;
  EXPECT_THROW(cache.request(0, std::span(&third, 1)), std::length_error);
  cache.prefetch(0, std::span(&third, 1));  // no unpinned slot: nothing happens
  EXPECT_FALSE(cache.cached(0, 2));
  cache.acquire(0, 0);
  cache.acquire(0, 1);
  cache.release(0, 0);
  cache.release(0, 1);
  cache.prefetch(0, std::span(&third, 1));  // evicts the least recent unpinned slot, without waiting
  EXPECT_TRUE(cache.cached(0, 2));
  f.use(cache, 2);
  const auto t = cache.telemetry();
  EXPECT_EQ(t.prefetches, 1u);
  EXPECT_EQ(t.prefetch_hits, 1u);
}

// A guess is for its layer's next request: one that request passes over is wasted there, stays cached, and frees
// its place under the prefetch limit (kept as a guess, unused guesses filled the limit and the lookahead stopped).
TEST(ExpertCache, AGuessItsLayersNextRequestPassesOverIsWastedAndFreesThePrefetchLimit) {
  CacheFixture f;
  tiering::ExpertCacheOptions o;
  o.slots = 4;
  o.prefetch_limit = 2;
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  const int32_t guesses[2] = {1, 2};
  cache.prefetch(0, guesses);
  f.use(cache, 1);  // layer 0's next routing asks for 1, not 2
  auto t = cache.telemetry();
  EXPECT_EQ(t.prefetch_hits, 1u);
  EXPECT_EQ(t.prefetch_wasted, 1u);  // 2, passed over
  EXPECT_TRUE(cache.cached(0, 2));   // still cached, no longer a guess
  const int32_t next[2] = {3, 4};
  cache.prefetch(0, next);  // both fit under the limit again
  t = cache.telemetry();
  EXPECT_EQ(t.prefetches, 4u);
  EXPECT_TRUE(cache.cached(0, 3));
  EXPECT_TRUE(cache.cached(0, 4));
  f.use(cache, 2);  // a plain hit now, not a prefetch hit
  t = cache.telemetry();
  EXPECT_EQ(t.prefetch_hits, 1u);
  EXPECT_EQ(t.prefetch_wasted, 3u);  // 3 and 4, passed over by this request of layer 0
  EXPECT_EQ(t.misses, 0u);
  EXPECT_LE(t.prefetch_hits + t.prefetch_wasted, t.prefetches);
}

}  // namespace

namespace tierlm {
namespace {

// A guess read in time saves at most min(read, lead); a wasted one costs a read: reading pays while
// precision x min(read, lead) >= (1 - precision) x read.
TEST(PrefetchGate, ReadsGuessesOnlyWhereTheirPrecisionPaysForTheWastedOnes) {
  // fit_accuracy_bench's streamed MoE on the device: ~57% of guesses used, a ~1 ms read, ~0.3 ms of a layer to hide
  // it in: reading them lost 10-40% of decode.
  EXPECT_FALSE(tiering::prefetch_worth_it(0.57, 1e-3, 0.3e-3));
  // The real-scale Qwen3-30B-A3B run: 90% used, 1.6 ms reads, 0.7 ms of a layer.
  EXPECT_TRUE(tiering::prefetch_worth_it(0.90, 1.6e-3, 0.7e-3));
  // A lead as long as the read: even odds break even.
  EXPECT_TRUE(tiering::prefetch_worth_it(0.5, 1e-3, 2e-3));
  EXPECT_FALSE(tiering::prefetch_worth_it(0.49, 1e-3, 2e-3));
  // No read measured (nor assumed) yet: read them.
  EXPECT_TRUE(tiering::prefetch_worth_it(0.0, 0.0, 1e-3));
  EXPECT_FALSE(tiering::prefetch_worth_it(0.99, 1e-3, 0.0));
}

// Wrong guesses stop being read (counted as skipped, still scored), and reading resumes once they are right again.
// A lead (10 ms: the pause between a guess and its layer's request) longer than the assumed read (1 ms; the reads
// measured here are shorter still) puts the break-even at a precision of one half.
TEST(ExpertCache, GuessesAreReadOnlyWhileTheirMeasuredPrecisionPays) {
  test::PackedExperts f;  // one layer of 6 experts
  tiering::ExpertCacheOptions o;
  o.slots = 2;
  o.prefetch_limit = 1;
  o.read_seconds_prior = 1e-3;
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  // One token's worth: a guess of an expert not in memory, a pause, then the layer's request (of `right` ? the
  // guess : expert 0). True if the guess was read.
  int32_t next = 0;
  auto round = [&](bool right) {
    do next = 1 + next % 5;
    while (cache.cached(0, next));
    const uint64_t before = cache.telemetry().prefetches;
    cache.prefetch(0, std::span(&next, 1));
    const bool read = cache.telemetry().prefetches > before;
    EXPECT_EQ(cache.cached(0, next), read);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    f.use(cache, right ? next : 0);
    return read;
  };
  EXPECT_TRUE(round(false));  // precision 1 before any guess was scored
  int wrong = 1;
  while (wrong < 200 && round(false)) ++wrong;
  auto t = cache.telemetry();
  // (63/64)^n < 1/2 from n = 45 wrong guesses on
  EXPECT_EQ(wrong, 45);
  EXPECT_LT(t.prefetch_precision, 0.5);
  EXPECT_EQ(t.prefetch_skipped, 1u);
  const uint64_t read_before = t.prefetches;
  EXPECT_FALSE(round(false));  // still wrong: still skipped
  int right = 0;
  while (right < 100 && !round(true)) ++right;
  t = cache.telemetry();
  // from (63/64)^47 back over one half: 1 - (1 - 0.477) (63/64)^n >= 1/2 from n = 3
  EXPECT_EQ(right, 3);
  EXPECT_GE(t.prefetch_precision, 0.5);
  EXPECT_EQ(t.prefetches, read_before + 1);
  EXPECT_EQ(t.prefetch_skipped, uint64_t(2 + right));
  EXPECT_GE(t.prefetch_lead_seconds, 10e-3);
}

// A guess whose layer is next requested long after (the sequence ended; the server idled, or a new prompt's
// prefill asks next) is dropped unscored: neither its precision nor its lead counts.
TEST(ExpertCache, StaleGuessesAreDroppedUnscored) {
  test::PackedExperts f;
  tiering::ExpertCacheOptions o;
  o.slots = 2;
  o.prefetch_limit = 1;
  o.stale_guess_seconds = 0.02;
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  const int32_t guess = 1;
  cache.prefetch(0, std::span(&guess, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  f.use(cache, 0);  // wrong, but stale
  auto t = cache.telemetry();
  EXPECT_EQ(t.prefetch_precision, 1.0);
  EXPECT_EQ(t.prefetch_lead_seconds, 0.0);
  const int32_t next = 2;
  cache.prefetch(0, std::span(&next, 1));
  f.use(cache, 0);  // wrong, in time: scored
  t = cache.telemetry();
  EXPECT_NEAR(t.prefetch_precision, 63.0 / 64, 1e-12);
  EXPECT_GT(t.prefetch_lead_seconds, 0.0);
  EXPECT_LT(t.prefetch_lead_seconds, 0.02);
}

// Without the gate every guess is read however wrong.
TEST(ExpertCache, WithoutTheGateEveryGuessIsRead) {
  test::PackedExperts f;
  tiering::ExpertCacheOptions o;
  o.slots = 2;
  o.prefetch_limit = 1;
  o.read_seconds_prior = 2e-3;
  o.adaptive_prefetch = false;
  tiering::ExpertCache cache(*f.store, *f.reader, f.ledger, o);
  for (int i = 0; i < 80; ++i) {
    const int32_t guess = 1 + i % 5;
    cache.prefetch(0, std::span(&guess, 1));
    EXPECT_TRUE(cache.cached(0, guess));
    f.use(cache, 0);
  }
  const auto t = cache.telemetry();
  EXPECT_EQ(t.prefetch_skipped, 0u);
  EXPECT_LT(t.prefetch_precision, 0.5);
}

}  // namespace
}  // namespace tierlm
