// Expert reads that fail, at the tiering level: the fault is a file truncated after the reader opened it (the read
// then finds "unexpected end of file") and restored afterwards (so a transient failure must not stick).
// ExpertReader: an error belongs to the ticket whose read failed; other tickets complete, the reader keeps working.
// ExpertCache: a failed demand read throws ReaderError naming the expert, the file and the offset once, leaves no pin
// and no key behind (the next request misses and reads again); a failed prefetch never throws into a request.
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/tiering/packed_experts_fixture.h"
#include "tiering/expert_cache.h"

using namespace tierlm;

namespace {

using test::random_bytes;

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no ReaderError";
  } catch (const tiering::ReaderError& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

class ReaderErrors : public ::testing::TestWithParam<bool> {};  // O_DIRECT through io_uring, or buffered pread

TEST_P(ReaderErrors, AnErrorBelongsToItsTicket) {
  test::TempDir dir;
  const auto path = dir / "f.bin";
  const std::string bytes = random_bytes(16 * 4096, 7);
  test::write_file(path, bytes);
  tiering::ReaderOptions o;
  o.direct = GetParam();
  o.block_size = 8192;
  tiering::ExpertReader reader({path.string()}, o);
  tiering::Ledger ledger;
  tiering::LedgerBuffer buf(ledger, "test", 8 * 4096, 4096);
  char* b = buf.as<char>();
  std::filesystem::resize_file(path, 8 * 4096);  // blocks 8..15 are gone

  const tiering::ReadRequest past_end{0, 10 * 4096, 2 * 4096, b};
  const auto bad = reader.submit(std::span(&past_end, 1));
  reader.drain();  // the failure has landed before the next ticket exists
  const tiering::ReadRequest inside{0, 2 * 4096, 3 * 4096, b + 4 * 4096};
  const auto good = reader.submit(std::span(&inside, 1));
  EXPECT_NO_THROW(reader.wait(good));  // another ticket's failure is not this one's
  EXPECT_EQ(std::memcmp(b + 4 * 4096, bytes.data() + 2 * 4096, 3 * 4096), 0);
  expect_error([&] { reader.wait(bad); }, {path.string(), "unexpected end of file at 40960"});
  EXPECT_NO_THROW(reader.wait(bad));  // reported once

  // One ticket with a good and a failing read fails as a whole; the one after it is fine.
  const tiering::ReadRequest mixed[2] = {{0, 0, 4096, b}, {0, 12 * 4096, 4096, b + 4096}};
  const auto both = reader.submit(mixed);
  const tiering::ReadRequest later{0, 7 * 4096, 4096, b + 2 * 4096};
  const auto after = reader.submit(std::span(&later, 1));
  EXPECT_NO_THROW(reader.wait(after));
  expect_error([&] { reader.wait(both); }, {"unexpected end of file at 49152"});

  // The file comes back: the same range reads, from the same reader.
  test::write_file(path, bytes);  // in place: the reader's descriptor stays valid
  EXPECT_NO_THROW(reader.wait(reader.submit(std::span(&past_end, 1))));
  EXPECT_EQ(std::memcmp(b, bytes.data() + 10 * 4096, 2 * 4096), 0);
  EXPECT_EQ(reader.direct(0), GetParam());
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, ReaderErrors, ::testing::Bool());

// The shared packed store, truncated and restored.
struct Store : test::PackedExperts {
  std::string bytes = slurp(path);
  uint64_t offset(int64_t expert) const {
    return tiering::kPackedHeaderBytes + uint64_t(expert) * store->layout().bytes;
  }
  void truncate_before(int64_t expert) { std::filesystem::resize_file(path, offset(expert)); }
  void restore_file() { test::write_file(path, bytes); }
  std::unique_ptr<tiering::ExpertCache> cache(int64_t slots, int64_t prefetch_limit) {
    tiering::ExpertCacheOptions o;
    o.slots = slots;
    o.prefetch_limit = prefetch_limit;
    o.adaptive_prefetch = false;  // every guess read: these tests fail their reads, whatever they would have paid
    return std::make_unique<tiering::ExpertCache>(*store, *reader, ledger, o);
  }
};

TEST(ExpertCacheErrors, FailedDemandReadThrowsOnceAndTheNextRequestReadsAgain) {
  Store f;
  const auto owned = f.cache(2, 0);
  tiering::ExpertCache& cache = *owned;
  f.use(cache, 0);
  f.truncate_before(3);
  // A batch of two: expert 1 reads, expert 4 does not.
  const int32_t batch[2] = {1, 4};
  cache.request(0, batch);
  EXPECT_EQ(Store::first(cache.acquire(0, 1)), 1.0f);
  expect_error([&] { cache.acquire(0, 4); },
               {"expert 0.4", f.path.string(), fmt::format("unexpected end of file at {}", f.offset(4))});
  cache.release(0, 1);
  cache.release(0, 4);  // a no-op: the failed slot is gone
  EXPECT_FALSE(cache.cached(0, 4));
  EXPECT_TRUE(cache.cached(0, 1));
  EXPECT_EQ(cache.available_slots(), 2);  // no pin left behind
  auto t = cache.telemetry();
  EXPECT_EQ(t.read_errors, 1u);
  EXPECT_EQ(t.misses, 3u);  // 0, 1, 4

  // Still missing: the next request reads it again and fails again, for that request only.
  cache.request(0, std::span(&batch[1], 1));
  expect_error([&] { cache.acquire(0, 4); }, {"expert 0.4"});
  cache.release(0, 4);
  EXPECT_EQ(cache.telemetry().read_errors, 2u);

  f.restore_file();
  f.use(cache, 4);  // a miss that reads, not a hit on a failed slot
  f.use(cache, 1);
  t = cache.telemetry();
  EXPECT_EQ(t.misses, 5u);
  EXPECT_EQ(t.hits, 1u);  // expert 1 again
  EXPECT_EQ(t.read_errors, 2u);
  EXPECT_EQ(cache.available_slots(), 2);
}

TEST(ExpertCacheErrors, FailedPrefetchNeverThrowsIntoARequest) {
  Store f;
  const auto owned = f.cache(3, 2);
  tiering::ExpertCache& cache = *owned;
  f.truncate_before(3);
  const int32_t four = 4, five = 5;
  // A guess nobody asks for fails: the next requests (which hand its landed read on) never see it; it is dropped.
  cache.prefetch(0, std::span(&four, 1));
  f.reader->drain();
  f.use(cache, 0);
  f.use(cache, 1);
  EXPECT_FALSE(cache.cached(0, 4));
  EXPECT_EQ(cache.telemetry().read_errors, 1u);

  // A guess that failed and is asked for before anyone noticed: the request reads it again (here successfully).
  cache.prefetch(0, std::span(&five, 1));
  f.reader->drain();
  f.restore_file();
  cache.request(0, std::span(&five, 1));
  EXPECT_EQ(Store::first(cache.acquire(0, 5)), 5.0f);
  cache.release(0, 5);
  f.use(cache, 4);
  const auto t = cache.telemetry();
  EXPECT_EQ(t.read_errors, 2u);
  EXPECT_EQ(t.prefetches, 2u);
  EXPECT_EQ(t.prefetch_hits, 1u);
  EXPECT_EQ(cache.available_slots(), 3);
}

// Broken and restored in turns, with a prefetch of the next expert beside every request: a good round never throws
// (not even for a guess that failed in the broken round before), a broken one throws for every expert it must read,
// and no pin or key is ever left behind (every slot is usable after each failure).
TEST(ExpertCacheErrors, AlternatingFaultsLeaveEverySlotUsable) {
  Store f;
  const auto owned = f.cache(2, 1);
  tiering::ExpertCache& cache = *owned;
  uint64_t failures = 0;
  for (int round = 0; round < 6; ++round) {
    const bool broken = round % 2 == 1;
    if (broken) f.truncate_before(0);
    for (int32_t e = 0; e < 6; ++e) {
      const int32_t next = (e + 1) % 6;
      const bool in_memory = cache.cached(0, e);  // (maybe a guess whose read raced the truncation)
      cache.request(0, std::span(&e, 1));
      cache.prefetch(0, std::span(&next, 1));
      bool threw = false;
      try {
        EXPECT_EQ(Store::first(cache.acquire(0, e)), float(e));
      } catch (const tiering::ReaderError& error) {
        threw = true;
        EXPECT_TRUE(broken) << error.what();
        ++failures;
      }
      if (broken && !in_memory) {
        EXPECT_TRUE(threw) << "expert " << e << " came from a truncated file";
      }
      cache.release(0, e);
      EXPECT_EQ(cache.available_slots(), 2);
    }
    if (broken) {
      f.reader->drain();  // the broken round's last guess fails before the file comes back
      f.restore_file();
    }
  }
  EXPECT_GE(failures, 15u);  // at least 5 of 6 per broken round
  EXPECT_GE(cache.telemetry().read_errors, failures);
}

}  // namespace
