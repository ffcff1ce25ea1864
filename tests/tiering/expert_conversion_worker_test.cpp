// The expert cache's conversion worker (ExpertCacheOptions::convert_on_worker) moves where a miss's read bytes are
// converted into the slot format, not what they become: one decode-like sequence through a cache with the worker
// and one without gives, at every acquire, exactly the bytes ExpertStore::finish writes for that expert (the oracle,
// made beforehand into fresh blocks, every part compared), and the same hit, miss, prefetch, eviction and byte counters. Two encodings: MLX
// 4-bit (repacked from staging straight into the slot, no scratch) and dense bf16 into q8_0 slots (scratch-using
// conversions, which the cache runs one at a time within its one-conversion reservation). Only tiering and kernels
// are linked in, so the test also builds under ThreadSanitizer on its own.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "runtime/kernels/thread_pool.h"
#include "tiering/expert_cache.h"

using namespace tierlm;

namespace {

struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& name) {
    // Not /dev/shm or a tmpfs: the reads should be io_uring + O_DIRECT, truly asynchronous.
    path = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  }
  ~TempFile() { std::filesystem::remove(path); }
};

// E experts of one layer written back to back at unaligned offsets (as tensors sit in a safetensors file), and the
// store over them.
// `broken`: an expert whose first scale tensor's extent is listed 2 bytes short (as a lying header would), so its
// read succeeds and its conversion (ExpertStore::finish) fails; -1: none.
tiering::ExpertStore write_store(const std::filesystem::path& path, tiering::ExpertEncoding encoding, int64_t E,
                                 int64_t H, int64_t I, int64_t broken = -1) {
  std::mt19937_64 rng(11);
  std::string file(100, '\0');  // a header-like prefix: nothing below is 4 KiB aligned
  std::vector<std::vector<tiering::Extent>> extents;
  auto append = [&](std::string bytes, std::vector<tiering::Extent>& out) {
    out.push_back({0, file.size(), bytes.size()});
    file += bytes;
  };
  // f16 in [0.5, 1) (scales) or (-1, -0.5] (biases), normal numbers: the high byte 0x38 / 0xB8.
  auto halves = [&](size_t n, char high) {
    std::string s(2 * n, '\0');
    for (size_t i = 0; i < n; ++i) {
      s[2 * i] = char(rng());
      s[2 * i + 1] = high;
    }
    return s;
  };
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = char(rng());
    return s;
  };
  // bf16 of values in [-1, 1): a float's upper half.
  auto bf16 = [&](size_t n) {
    std::string s(2 * n, '\0');
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      const float f = value(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t h = uint16_t(bits >> 16);
      std::memcpy(&s[2 * i], &h, 2);
    }
    return s;
  };
  const bool mlx = encoding == tiering::ExpertEncoding::mlx;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<tiering::Extent> ext;
    for (auto [rows, cols] : {std::pair{I, H}, {I, H}, {H, I}}) {
      if (mlx) {
        append(random_bytes(size_t(rows * cols / 2)), ext);
        append(halves(size_t(rows * cols / 32), char(0x38)), ext);
        append(halves(size_t(rows * cols / 32), char(0xB8)), ext);
      } else {
        append(bf16(size_t(rows * cols)), ext);
      }
    }
    if (e == broken) ext.at(1).length -= 2;
    extents.push_back(std::move(ext));
  }
  std::ofstream(path, std::ios::binary).write(file.data(), std::streamsize(file.size()));
  const auto layout = mlx ? tiering::ExpertLayout::make(kernels::WeightFormat::mlx_q4, H, I, 32, 4)
                          : tiering::ExpertLayout::make(kernels::WeightFormat::q8_0, H, I);
  return tiering::ExpertStore({path.string()}, 1, E, encoding, mlx ? kernels::SourceType::f16 : kernels::SourceType::bf16,
                              layout, std::move(extents));
}

void check_worker_matches_inline(tiering::ExpertEncoding encoding) {
  const int64_t E = 24, H = 256, I = 128;
  TempFile file("tierlm-conversion-worker");
  const tiering::ExpertStore store = write_store(file.path, encoding, E, H, I);
  const size_t bytes = store.layout().bytes;
  std::vector<std::string> oracle;
  {
    tiering::Ledger ledger;
    tiering::ExpertReader reader(store.files());
    tiering::LedgerBuffer staging(ledger, "t", store.staging_bytes(), 4096), block(ledger, "t", bytes, 4096);
    for (int64_t e = 0; e < E; ++e) {
      std::memset(block.data(), 0, bytes);
      reader.wait(reader.submit(store.plan(0, e, block.data(), staging.data())));
      store.finish(0, e, staging.data(), block.data(), ledger);
      oracle.emplace_back(block.as<char>(), bytes);
    }
  }
  auto run = [&](bool worker) {
    tiering::Ledger ledger;
    tiering::ReaderOptions ro;
    ro.queue_depth = 4;  // fewer than the reads of a batch: some land while others are acquired
    ro.block_size = 8192;
    tiering::ExpertReader reader(store.files(), ro);
    EXPECT_TRUE(reader.using_io_uring() && reader.direct(0)) << "the reads are not asynchronous here";
    tiering::ExpertCacheOptions o;
    o.slots = 5;  // a batch of 4 misses after 3 unused prefetches evicts some of them, landed or not
    o.prefetch_limit = 3;
    o.resident = {{0, 0}, {0, 1}};
    o.convert_on_worker = worker;
    // Random guesses: every one read (the gate would stop them, and when depends on the reads' timing).
    o.adaptive_prefetch = false;
    tiering::ExpertCache cache(store, reader, ledger, o);
    EXPECT_EQ(ledger.used("expert_staging"), store.conversion_bytes());  // one conversion's scratch, either way
    kernels::ThreadPool pool(3, /*pin=*/false);  // the acquiring thread's pool: its own conversions split over it
    std::mt19937 rng(7);
    auto pick = [&](int n) {
      std::vector<int32_t> out;
      while (int(out.size()) < n) {
        const int32_t e = int32_t(rng() % uint32_t(E));
        if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
      }
      return out;
    };
    for (int round = 0; round < 400; ++round) {
      const std::vector<int32_t> batch = pick(1 + int(rng() % 4)), guess = pick(3);
      // A prefetch passes over unpinned slots whose reads are still in flight (it never waits), so which slot it
      // takes would depend on the disk's timing: with the earlier prefetches landed it is the same choice in both
      // runs (a prefetch never evicts a guess of its own call: whether that read had landed would decide it, which
      // is how one CI run under ASan saw a 363rd prefetch). The batch's own reads (pinned) stay in flight into the acquires below, and the conversions (the
      // worker's, the acquiring thread's) race with them.
      reader.drain();
      cache.request(0, batch);
      cache.prefetch(0, guess);
      for (int32_t e : batch) {
        const tiering::ExpertViews v = cache.acquire(0, e, &pool);
        // Every part's bytes (the alignment padding between parts is never written, so it is not compared).
        const char* slot = static_cast<const char*>(v.gate_up.data) - store.layout().parts[0].offset;
        for (const tiering::ExpertLayout::Part& part : store.layout().parts)
          EXPECT_EQ(std::memcmp(slot + part.offset, oracle[size_t(e)].data() + part.offset, part.bytes), 0)
              << "round " << round << " expert " << e << " part at " << part.offset;
        cache.release(0, e);
      }
    }
    reader.drain();  // the last prefetches' bytes counted however far they had got
    return cache.telemetry();
  };
  const tiering::ExpertTierTelemetry inline_run = run(false), worker_run = run(true);
  for (const auto* t : {&inline_run, &worker_run})
    std::printf("misses %llu hits %llu prefetches %llu prefetch hits %llu wasted %llu evictions %llu conversions %llu "
                "(forward thread %llu, %.3f ms; waited %.3f ms)\n",
                (unsigned long long)t->misses, (unsigned long long)t->hits, (unsigned long long)t->prefetches,
                (unsigned long long)t->prefetch_hits, (unsigned long long)t->prefetch_wasted,
                (unsigned long long)t->evictions, (unsigned long long)t->conversions,
                (unsigned long long)t->inline_conversions, 1e3 * t->inline_conversion_seconds,
                1e3 * t->conversion_wait_seconds);
  EXPECT_GT(inline_run.misses, 200u);
  EXPECT_GT(inline_run.prefetch_hits, 20u);
  EXPECT_GT(inline_run.prefetch_wasted, 20u);
  for (const auto* t : {&inline_run, &worker_run}) {
    EXPECT_EQ(t->hits, inline_run.hits);
    EXPECT_EQ(t->misses, inline_run.misses);
    EXPECT_EQ(t->resident_hits, inline_run.resident_hits);
    EXPECT_EQ(t->prefetches, inline_run.prefetches);
    EXPECT_EQ(t->prefetch_hits, inline_run.prefetch_hits);
    EXPECT_EQ(t->prefetch_wasted, inline_run.prefetch_wasted);
    EXPECT_EQ(t->evictions, inline_run.evictions);
    EXPECT_EQ(t->bytes_read, inline_run.bytes_read);
    // Every miss and every used prefetch converted once; a wasted prefetch at most once (the worker may have got to
    // it before it was evicted).
    EXPECT_GE(t->conversions, t->misses + t->prefetch_hits);
    EXPECT_LE(t->conversions, t->misses + t->prefetches);
    EXPECT_LE(t->inline_conversions, t->conversions);
  }
  // Without the worker every conversion is the acquiring thread's, and only experts that were used are converted:
  // misses, prefetch hits, and guesses whose layer's next request passed them over (wasted) but a later one asked
  // for while they were still cached.
  EXPECT_LE(inline_run.conversions, inline_run.misses + inline_run.prefetch_hits + inline_run.prefetch_wasted);
  EXPECT_EQ(inline_run.inline_conversions, inline_run.conversions);
  EXPECT_EQ(inline_run.conversion_wait_seconds, 0.0);
  // With it, the unused prefetches at least were converted off the acquiring thread.
  EXPECT_LT(worker_run.inline_conversions, worker_run.conversions);
}

// The MLX repack split over a pool by panels (the three pieces' panels numbered in a row, so a thread's range can
// straddle gate, up and down) writes exactly the bytes of the one-thread repack, for every pool size.
TEST(ExpertConversionWorker, MlxRepackSplitOverAPoolWritesTheSameBytes) {
  const int64_t E = 2, H = 2080, I = 512;  // panels: gate 32, up 32, down 130; 1.6 MB, so the repack is split

  TempFile file("tierlm-conversion-pool");
  const tiering::ExpertStore store = write_store(file.path, tiering::ExpertEncoding::mlx, E, H, I);
  const size_t bytes = store.layout().bytes;
  ASSERT_GE(bytes, tiering::ExpertStore::kSplitConversionBytes);
  tiering::Ledger ledger;
  tiering::ExpertReader reader(store.files());
  tiering::LedgerBuffer staging(ledger, "t", store.staging_bytes(), 4096), block(ledger, "t", bytes, 4096);
  for (int64_t e = 0; e < E; ++e) {
    reader.wait(reader.submit(store.plan(0, e, block.data(), staging.data())));
    std::memset(block.data(), 0x5A, bytes);
    store.finish(0, e, staging.data(), block.data(), ledger);
    const std::string alone(block.as<char>(), bytes);
    for (int threads : {2, 3, 5, 7, 16}) {
      kernels::ThreadPool pool(threads, /*pin=*/false);
      std::memset(block.data(), 0x5A, bytes);  // the same fill: padding between parts compares equal too
      store.finish(0, e, staging.data(), block.data(), ledger, &pool);
      EXPECT_EQ(std::memcmp(block.data(), alone.data(), bytes), 0) << "expert " << e << ", " << threads << " threads";
    }
  }
}

// A conversion that fails (the read landed, ExpertStore::finish threw), on the worker or inline: the acquire of
// that expert throws ReaderError naming it, once; nothing stays pinned or cached, the other experts are served,
// the failure is counted (read_errors, as /health shows it), and a later request reads it again rather than
// finding a failed slot. A guess whose conversion fails never throws into a request.
class ConversionErrors : public ::testing::TestWithParam<bool> {};  // on the worker, or inline

TEST_P(ConversionErrors, AFailedConversionFailsOnlyItsAcquireAndLeavesNothingBehind) {
  const int64_t E = 8, H = 256, I = 128;
  const int32_t broken = 3;
  TempFile file("tierlm-conversion-errors");
  const tiering::ExpertStore store = write_store(file.path, tiering::ExpertEncoding::mlx, E, H, I, broken);
  tiering::Ledger ledger;
  tiering::ExpertReader reader(store.files());
  tiering::ExpertCacheOptions o;
  o.slots = 4;
  o.prefetch_limit = 2;
  o.adaptive_prefetch = false;  // the guess below is read whatever the running precision says
  o.convert_on_worker = GetParam();
  tiering::ExpertCache cache(store, reader, ledger, o);
  const uint64_t slot_bytes = ledger.used(tiering::accounts::expert_cache);

  auto expect_failure = [&](int32_t e) {
    try {
      cache.acquire(0, e);
      ADD_FAILURE() << "no ReaderError for expert " << e;
    } catch (const tiering::ReaderError& err) {
      EXPECT_NE(std::string(err.what()).find("0.3"), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("MLX tensor sizes do not match"), std::string::npos) << err.what();
    }
    cache.release(0, e);  // a no-op after a throw
  };
  const int32_t three[3] = {1, broken, 2};
  cache.request(0, three);
  EXPECT_NO_THROW(cache.acquire(0, 1));
  expect_failure(broken);
  EXPECT_NO_THROW(cache.acquire(0, 2));  // the failure is that expert's alone
  cache.release(0, 1);
  cache.release(0, 2);
  EXPECT_FALSE(cache.cached(0, broken));
  EXPECT_EQ(cache.available_slots(), 4);  // no pin left behind
  EXPECT_EQ(cache.telemetry().read_errors, 1u);

  // Asked again: read and converted again (and failing again), not a failed slot handed back.
  const uint64_t read_before = cache.telemetry().bytes_read;
  cache.request(0, std::span(&broken, 1));
  expect_failure(broken);
  EXPECT_GT(cache.telemetry().bytes_read, read_before);
  EXPECT_EQ(cache.telemetry().read_errors, 2u);

  // A guess of it: its conversion fails off any request; the next request of another expert is served, and a request
  // of the broken one reads it again and fails in its own acquire.
  const int32_t guess[2] = {broken, 5};
  cache.prefetch(0, guess);
  reader.drain();
  const int32_t other = 6;
  cache.request(0, std::span(&other, 1));
  EXPECT_NO_THROW(cache.acquire(0, other));
  cache.release(0, other);
  cache.request(0, std::span(&broken, 1));
  expect_failure(broken);
  EXPECT_EQ(cache.available_slots(), 4);
  EXPECT_GE(cache.telemetry().read_errors, 3u);
  EXPECT_EQ(ledger.used(tiering::accounts::expert_cache), slot_bytes);  // the slots stayed within their reservation
}

INSTANTIATE_TEST_SUITE_P(WorkerAndInline, ConversionErrors, ::testing::Bool());

TEST(ExpertConversionWorker, MlxSlotsAndCountersMatchConvertingInline) {
  check_worker_matches_inline(tiering::ExpertEncoding::mlx);
}

TEST(ExpertConversionWorker, ScratchUsingConversionsMatchConvertingInline) {
  check_worker_matches_inline(tiering::ExpertEncoding::dense);
}

}  // namespace
