// A tiny fixed thread pool for the CPU backend's parallel loops (the big GEMVs, attention heads, experts).
// ParallelFor splits [0, n) into one contiguous range per thread and blocks until all are done; the calling
// thread runs the first range itself. Used by one caller thread at a time (the engine thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4::kernels::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // fn(begin, end) over a split of [0, n). Runs inline when n < min_per_thread * 2 or there is one thread.
  void ParallelFor(int64_t n, int64_t min_per_thread, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;  // guarded by mu_
  std::vector<std::pair<int64_t, int64_t>> ranges_;              // guarded by mu_
  uint64_t generation_ = 0;                                      // guarded by mu_
  int pending_ = 0;                                              // guarded by mu_
  bool stop_ = false;                                            // guarded by mu_
};

}  // namespace dsv4::kernels::cpu
