// runtime/kernels/bandwidth.cpp — the probes behind bandwidth.h. Baseline SSE2 is enough: two 16-byte loads per
// cycle per core are several times what DRAM can feed, so the loop is never the limit for buffers past the caches.
#include "runtime/kernels/bandwidth.h"

#include <emmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tierlm::kernels {

namespace {

constexpr size_t kChunk = 64 * 1024;  // unit of work split across threads (whole pages)
// Software prefetch distance, the same the matvec kernels use: without it one core keeps too few misses in flight
// and the probe would understate what a streaming kernel can reach (matvec then "beats" the roofline).
constexpr int kPrefetchBytes = 4096;

tiering::Ledger& ledger_of(const BandwidthOptions& o) { return o.ledger ? *o.ledger : tiering::Ledger::global(); }

size_t usable_bytes(size_t bytes) {
  if (bytes < kChunk) throw std::invalid_argument("bandwidth probe: buffer must be at least 64 KiB");
  return bytes / kChunk * kChunk;
}

struct Buffers {
  char* a = nullptr;
  const char* b = nullptr;
  const char* c = nullptr;
  size_t bytes = 0;
  volatile int64_t sink[64] = {};
};

// Touches the pages from the threads that will read them (first-touch placement).
void first_touch(ThreadPool& pool, char* p, size_t bytes) {
  struct Ctx {
    char* p;
  } ctx{p};
  pool.parallel_for(static_cast<int64_t>(bytes / kChunk), [](void* c, int64_t b, int64_t e, int) {
    char* base = static_cast<Ctx*>(c)->p;
    for (int64_t i = b; i < e; ++i) std::memset(base + i * kChunk, static_cast<int>(i & 0x7F), kChunk);
  }, &ctx);
}

void read_range(void* ctx, int64_t b, int64_t e, int thread) {
  auto* buf = static_cast<Buffers*>(ctx);
  const __m128i* p = reinterpret_cast<const __m128i*>(buf->b + b * kChunk);
  const __m128i* end = reinterpret_cast<const __m128i*>(buf->b + e * kChunk);
  __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
  for (; p < end; p += 4) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
    s0 = _mm_add_epi64(s0, _mm_load_si128(p));
    s1 = _mm_add_epi64(s1, _mm_load_si128(p + 1));
    s2 = _mm_add_epi64(s2, _mm_load_si128(p + 2));
    s3 = _mm_add_epi64(s3, _mm_load_si128(p + 3));
  }
  const __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
  buf->sink[thread & 63] = _mm_cvtsi128_si64(s) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
}

void copy_range(void* ctx, int64_t b, int64_t e, int) {
  auto* buf = static_cast<Buffers*>(ctx);
  const __m128i* src = reinterpret_cast<const __m128i*>(buf->b + b * kChunk);
  __m128i* dst = reinterpret_cast<__m128i*>(buf->a + b * kChunk);
  const int64_t n = (e - b) * static_cast<int64_t>(kChunk / 16);
  for (int64_t i = 0; i < n; i += 4) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes, _MM_HINT_T0);
    _mm_store_si128(dst + i, _mm_load_si128(src + i));
    _mm_store_si128(dst + i + 1, _mm_load_si128(src + i + 1));
    _mm_store_si128(dst + i + 2, _mm_load_si128(src + i + 2));
    _mm_store_si128(dst + i + 3, _mm_load_si128(src + i + 3));
  }
}

void triad_range(void* ctx, int64_t b, int64_t e, int) {
  auto* buf = static_cast<Buffers*>(ctx);
  const float* x = reinterpret_cast<const float*>(buf->b + b * kChunk);
  const float* y = reinterpret_cast<const float*>(buf->c + b * kChunk);
  float* out = reinterpret_cast<float*>(buf->a + b * kChunk);
  const __m128 s = _mm_set1_ps(3.0f);
  const int64_t n = (e - b) * static_cast<int64_t>(kChunk / 4);
  for (int64_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(y + i) + kPrefetchBytes, _MM_HINT_T0);
    _mm_store_ps(out + i + 8, _mm_add_ps(_mm_load_ps(x + i + 8), _mm_mul_ps(s, _mm_load_ps(y + i + 8))));
    _mm_store_ps(out + i + 12, _mm_add_ps(_mm_load_ps(x + i + 12), _mm_mul_ps(s, _mm_load_ps(y + i + 12))));
    _mm_store_ps(out + i, _mm_add_ps(_mm_load_ps(x + i), _mm_mul_ps(s, _mm_load_ps(y + i))));
    _mm_store_ps(out + i + 4, _mm_add_ps(_mm_load_ps(x + i + 4), _mm_mul_ps(s, _mm_load_ps(y + i + 4))));
  }
}

double best_gbs(ThreadPool& pool, Buffers& buf, ThreadPool::RangeFn fn, double bytes_per_pass, int repeats) {
  const int64_t chunks = static_cast<int64_t>(buf.bytes / kChunk);
  pool.parallel_for(chunks, fn, &buf);  // warm-up: TLB, page tables, clocks
  double best = 0.0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(chunks, fn, &buf);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes_per_pass / s / 1e9);
  }
  return best;
}

}  // namespace

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, const BandwidthOptions& options) {
  bytes = usable_bytes(bytes);
  tiering::LedgerBuffer b(ledger_of(options), tiering::accounts::scratch, bytes, kChunk);
  first_touch(pool, b.as<char>(), bytes);
  Buffers buf;
  buf.b = b.as<char>();
  buf.bytes = bytes;
  return best_gbs(pool, buf, read_range, static_cast<double>(bytes), options.repeats);
}

double measure_copy_bandwidth_gbs(ThreadPool& pool, size_t bytes, const BandwidthOptions& options) {
  bytes = usable_bytes(bytes);
  tiering::LedgerBuffer a(ledger_of(options), tiering::accounts::scratch, bytes, kChunk);
  tiering::LedgerBuffer b(ledger_of(options), tiering::accounts::scratch, bytes, kChunk);
  first_touch(pool, a.as<char>(), bytes);
  first_touch(pool, b.as<char>(), bytes);
  Buffers buf;
  buf.a = a.as<char>();
  buf.b = b.as<char>();
  buf.bytes = bytes;
  return best_gbs(pool, buf, copy_range, 2.0 * static_cast<double>(bytes), options.repeats);
}

double measure_triad_bandwidth_gbs(ThreadPool& pool, size_t bytes, const BandwidthOptions& options) {
  bytes = usable_bytes(bytes);
  tiering::LedgerBuffer a(ledger_of(options), tiering::accounts::scratch, bytes, kChunk);
  tiering::LedgerBuffer b(ledger_of(options), tiering::accounts::scratch, bytes, kChunk);
  tiering::LedgerBuffer c(ledger_of(options), tiering::accounts::scratch, bytes, kChunk);
  first_touch(pool, a.as<char>(), bytes);
  first_touch(pool, b.as<char>(), bytes);
  first_touch(pool, c.as<char>(), bytes);
  // first_touch fills with small byte patterns: valid, finite floats.
  Buffers buf;
  buf.a = a.as<char>();
  buf.b = b.as<char>();
  buf.c = c.as<char>();
  buf.bytes = bytes;
  return best_gbs(pool, buf, triad_range, 3.0 * static_cast<double>(bytes), options.repeats);
}

}  // namespace tierlm::kernels
