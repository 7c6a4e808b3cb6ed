// Fixed thread pool: see thread_pool.h.
#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace dsv4::kernels::cpu {

ThreadPool::ThreadPool(int num_threads) {
  workers_.reserve(std::max(1, num_threads));
  for (int i = 1; i < std::max(1, num_threads); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::Run(int64_t n, int64_t min_per_thread, Trampoline call, void* fn) {
  if (n <= 0) return;
  const int64_t threads =
      std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread)));
  if (threads <= 1) {
    call(fn, 0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = call;
    fn_ = fn;
    n_ = n;
    threads_ = threads;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_work_.notify_all();
  call(fn, 0, n / threads, 0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  call_ = nullptr;
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    Trampoline call;
    void* fn;
    int64_t begin = 0, end = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      call = call_;
      fn = fn_;
      if (index < threads_) {
        begin = n_ * index / threads_;
        end = n_ * (index + 1) / threads_;
      }
    }
    if (end > begin) call(fn, begin, end, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

}  // namespace dsv4::kernels::cpu
