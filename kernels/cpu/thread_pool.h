// A tiny fixed thread pool for the CPU backend's parallel loops (GEMMs over output features, attention over
// (token, head) pairs, the indexer over tokens, the compressor over sequences).
//
// ParallelFor splits [0, n) into one contiguous range per thread and blocks until all are done; the calling
// thread runs range 0 itself. It never allocates: the callable is passed by address through a plain function
// pointer (no std::function), and each worker computes its own range from (n, threads). Each range gets its
// thread index in [0, size()) so callers can use per-thread scratch planned in advance.
//
// Threading: used by one caller thread at a time (the engine thread); fn must not call ParallelFor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace dsv4::kernels::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end, thread) over a split of [0, n) into at most size() ranges of at least min_per_thread
  // items (runs inline as one range when n < 2 * min_per_thread or the pool has one thread).
  template <typename F>
  void ParallelFor(int64_t n, int64_t min_per_thread, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    Run(n, min_per_thread,
        [](void* f, int64_t b, int64_t e, int thread) { (*static_cast<Fn*>(f))(b, e, thread); },
        const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
  }

 private:
  using Trampoline = void (*)(void* fn, int64_t begin, int64_t end, int thread);

  void Run(int64_t n, int64_t min_per_thread, Trampoline call, void* fn);
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  // The current job, guarded by mu_: range i of `threads` is [n * i / threads, n * (i + 1) / threads).
  Trampoline call_ = nullptr;
  void* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t threads_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace dsv4::kernels::cpu
