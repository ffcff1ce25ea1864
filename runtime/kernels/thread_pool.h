// runtime/kernels/thread_pool.h — a fixed pool of worker threads pinned to cores with hwloc.
// Owns: worker threads and the fork/join of parallel_for. Never: allocates per call, logs in parallel_for.
//
// Fork/join costs a few microseconds: workers spin on a generation counter for a short while after each job
// (decode issues several parallel_for calls per layer, microseconds apart) and only then sleep on a futex.
// With pin = true, worker i is bound to physical core i and the constructing thread (thread 0, the caller of
// parallel_for) to core 0 until the pool is destroyed, when its previous affinity is restored. Threads created by
// the constructing thread meanwhile inherit that binding.
#pragma once

#include <cstdint>
#include <functional>

namespace tierlm::kernels {

class ThreadPool {
 public:
  // threads <= 0: one per physical core (hwloc). pin: bind thread i to core i. ThreadPool(1, false) is a serial
  // pool: parallel_for runs fn on the calling thread, any thread, several at once (it keeps no state per call).
  explicit ThreadPool(int threads = 0, bool pin = true);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;
  // Splits [0, n) into contiguous chunks, one per thread (the caller is thread 0), and waits for all.
  // fn(begin, end, thread_index). Not reentrant: do not call parallel_for from inside fn.
  // Threads whose chunk is empty (n < size()) are not called.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  // Same contract without std::function (whose construction may allocate for large captures): hot paths pass a
  // capture-less function and a pointer to their arguments.
  using RangeFn = void (*)(void* context, int64_t begin, int64_t end, int thread_index);
  void parallel_for(int64_t n, RangeFn fn, void* context);

  // parallel_for calls so far that forked to the workers (a serial pool, or n == 1, runs inline and is not counted):
  // for a caller that wants to know how many fork/joins a piece of work paid. Read by the calling thread.
  uint64_t forks() const;

  // Number of physical cores hwloc sees in this process's allowed cpuset (at least 1).
  static int physical_cores();

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace tierlm::kernels
