// runtime/kernels/thread_pool.cpp — fork/join over a generation counter: the caller publishes a job, bumps the
// generation, runs chunk 0 itself and spins until the pending count reaches zero. Workers spin on the generation
// for kSpinMicros, then sleep in a futex wait (std::atomic::wait); the caller only issues the wake syscall when
// some worker is actually asleep.
#include "runtime/kernels/thread_pool.h"

#include <hwloc.h>
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

namespace tierlm::kernels {

namespace {

constexpr int kSpinMicros = 200;

inline void cpu_relax() { _mm_pause(); }

}  // namespace

struct ThreadPool::Impl {
  int size = 1;
  bool pin = false;
  hwloc_topology_t topology = nullptr;
  hwloc_cpuset_t caller_previous = nullptr;
  std::vector<std::thread> workers;

  alignas(64) std::atomic<uint32_t> generation{0};
  alignas(64) std::atomic<int> pending{0};
  alignas(64) std::atomic<int> sleepers{0};
  alignas(64) RangeFn fn = nullptr;
  void* context = nullptr;
  int64_t n = 0;
  uint64_t forks = 0;  // parallel_for calls that woke the workers (one caller at a time on this path)
  bool stop = false;

  void bind_current_thread(int index) {
    if (!topology) return;
    const int cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
    if (cores <= 0) return;
    hwloc_obj_t core = hwloc_get_obj_by_type(topology, HWLOC_OBJ_CORE, static_cast<unsigned>(index % cores));
    if (!core || !core->cpuset) return;
    hwloc_cpuset_t set = hwloc_bitmap_dup(core->cpuset);
    hwloc_bitmap_singlify(set);
    hwloc_set_cpubind(topology, set, HWLOC_CPUBIND_THREAD);  // best effort: a refused bind only costs locality
    hwloc_bitmap_free(set);
  }

  void run_chunk(int index) {
    const int64_t begin = n * index / size;
    const int64_t end = n * (index + 1) / size;
    if (begin < end) fn(context, begin, end, index);
  }

  void worker_loop(int index) {
    if (pin) bind_current_thread(index);
    uint32_t seen = 0;
    for (;;) {
      uint32_t g = generation.load(std::memory_order_acquire);
      if (g == seen) {
        const auto start = std::chrono::steady_clock::now();
        for (int spins = 0; g == seen; ++spins) {
          cpu_relax();
          g = generation.load(std::memory_order_acquire);
          if ((spins & 255) == 255 &&
              std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSpinMicros))
            break;
        }
      }
      if (g == seen) {
        sleepers.fetch_add(1, std::memory_order_seq_cst);
        while ((g = generation.load(std::memory_order_seq_cst)) == seen) generation.wait(seen, std::memory_order_seq_cst);
        sleepers.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = g;
      if (stop) {
        pending.fetch_sub(1, std::memory_order_acq_rel);
        return;
      }
      run_chunk(index);
      pending.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  void publish_and_run() {
    pending.store(size - 1, std::memory_order_relaxed);
    generation.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) generation.notify_all();
    if (!stop) run_chunk(0);
    for (int spins = 0; pending.load(std::memory_order_acquire) != 0; ++spins) {
      // On an oversubscribed machine a worker may be descheduled; stop burning its core after a while.
      if (spins > 4096) {
        std::this_thread::yield();
      } else {
        cpu_relax();
      }
    }
  }
};

int ThreadPool::physical_cores() {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return 1;
  int cores = 1;
  if (hwloc_topology_load(topology) == 0) cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
  hwloc_topology_destroy(topology);
  return cores > 0 ? cores : 1;
}

ThreadPool::ThreadPool(int threads, bool pin) : impl_(new Impl) {
  Impl& p = *impl_;
  if (threads == 1 && !pin) {  // a serial pool (the caller alone): no topology to load, no thread to start
    p.size = 1;
    p.pin = false;
    return;
  }
  if (hwloc_topology_init(&p.topology) != 0 || hwloc_topology_load(p.topology) != 0) {
    if (p.topology) hwloc_topology_destroy(p.topology);
    p.topology = nullptr;
  }
  int cores = p.topology ? hwloc_get_nbobjs_by_type(p.topology, HWLOC_OBJ_CORE) : 0;
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.size = threads > 0 ? threads : cores;
  p.pin = pin && p.topology != nullptr;
  if (p.size > cores && p.pin) {
    spdlog::warn("[kernels] thread pool of {} threads on {} physical cores: threads share cores", p.size, cores);
  }
  if (p.pin) {
    p.caller_previous = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(p.topology, p.caller_previous, HWLOC_CPUBIND_THREAD) != 0) {
      hwloc_bitmap_free(p.caller_previous);
      p.caller_previous = nullptr;
    }
    p.bind_current_thread(0);
  }
  p.workers.reserve(static_cast<size_t>(p.size - 1));
  for (int i = 1; i < p.size; ++i) p.workers.emplace_back([this, i] { impl_->worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  Impl& p = *impl_;
  p.stop = true;
  if (!p.workers.empty()) p.publish_and_run();
  for (auto& t : p.workers) t.join();
  if (p.caller_previous) {
    hwloc_set_cpubind(p.topology, p.caller_previous, HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(p.caller_previous);
  }
  if (p.topology) hwloc_topology_destroy(p.topology);
  delete impl_;
}

int ThreadPool::size() const { return impl_->size; }

void ThreadPool::parallel_for(int64_t n, RangeFn fn, void* context) {
  if (n <= 0) return;
  Impl& p = *impl_;
  if (p.size == 1 || n == 1) {
    fn(context, 0, n, 0);
    return;
  }
  p.fn = fn;
  p.context = context;
  p.n = n;
  ++p.forks;
  p.publish_and_run();
}

uint64_t ThreadPool::forks() const { return impl_->forks; }

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  using Fn = std::function<void(int64_t, int64_t, int)>;
  parallel_for(n, [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<const Fn*>(ctx))(b, e, t); },
               const_cast<Fn*>(&fn));
}

}  // namespace tierlm::kernels
