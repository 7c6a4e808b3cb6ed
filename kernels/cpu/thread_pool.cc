// Fixed thread pool: see thread_pool.h.
#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace dsv4::kernels::cpu {

ThreadPool::ThreadPool(int num_threads) {
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

void ThreadPool::ParallelFor(int64_t n, int64_t min_per_thread,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread)));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> ranges(size(), {0, 0});
  for (int64_t i = 0; i < threads; ++i) ranges[i] = {n * i / threads, n * (i + 1) / threads};
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    ranges_ = ranges;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_work_.notify_all();
  fn(ranges[0].first, ranges[0].second);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    std::pair<int64_t, int64_t> range;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      range = ranges_[index];
    }
    if (range.second > range.first) (*job)(range.first, range.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

}  // namespace dsv4::kernels::cpu
