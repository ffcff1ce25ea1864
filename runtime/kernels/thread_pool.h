// runtime/kernels/thread_pool.h — a fixed pool of worker threads pinned to cores with hwloc.
// Owns: worker threads and the fork/join of parallel_for. Never: allocates per call, logs in parallel_for.
#pragma once

#include <cstdint>
#include <functional>

namespace tierlm::kernels {

class ThreadPool {
 public:
  // threads <= 0: one per physical core (hwloc). pin: bind thread i to core i.
  explicit ThreadPool(int threads = 0, bool pin = true);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;
  // Splits [0, n) into contiguous chunks, one per thread (the caller is thread 0), and waits for all.
  // fn(begin, end, thread_index). Not reentrant: do not call parallel_for from inside fn.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace tierlm::kernels
