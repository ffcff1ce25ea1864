// ThreadPool: every index visited exactly once, chunks contiguous, thread indices valid, cheap repeated fork/join.
#include "runtime/kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace tierlm::kernels {
namespace {

TEST(ThreadPool, EveryIndexVisitedOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
        if (t < 0 || t >= threads || b >= e) bad_thread.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      EXPECT_EQ(bad_thread.load(), 0);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, CallerIsThreadZeroAndChunksAreContiguous) {
  ThreadPool pool(2);
  std::vector<std::thread::id> who(2);
  std::vector<int64_t> begin(2, -1), end(2, -1);
  pool.parallel_for(10, [&](int64_t b, int64_t e, int t) {
    who[t] = std::this_thread::get_id();
    begin[t] = b;
    end[t] = e;
  });
  EXPECT_EQ(who[0], std::this_thread::get_id());
  EXPECT_NE(who[1], std::this_thread::get_id());
  EXPECT_EQ(begin[0], 0);
  EXPECT_EQ(end[0], begin[1]);
  EXPECT_EQ(end[1], 10);
}

TEST(ThreadPool, ManyRepeatedJobsAndSleepWake) {
  ThreadPool pool(0);
  EXPECT_GE(pool.size(), 1);
  std::atomic<int64_t> sum{0};
  struct Ctx {
    std::atomic<int64_t>* sum;
  } ctx{&sum};
  for (int rep = 0; rep < 20000; ++rep) {
    pool.parallel_for(100, [](void* c, int64_t b, int64_t e, int) {
      static_cast<Ctx*>(c)->sum->fetch_add(e - b);
    }, &ctx);
    if (rep % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let workers fall asleep
  }
  EXPECT_EQ(sum.load(), 20000 * 100);
}

TEST(ThreadPool, PhysicalCoresPositive) { EXPECT_GE(ThreadPool::physical_cores(), 1); }

}  // namespace
}  // namespace tierlm::kernels
