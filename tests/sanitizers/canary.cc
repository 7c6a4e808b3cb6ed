// Canaries for the sanitizer builds: each mode commits one defect the sanitizer of that build must report, or
// (the *_ok modes) synchronises correctly and must not be reported. They prove that CI's sanitizer stages really
// detect something: a flag lost in the build, an option that silences reports, or a TSan suppression or abseil
// annotation (tsan_absl_sync.cc) that hides our own races would make one of them fail.
//   canary heap_overflow | signed_overflow | race | race_one_side_locked | absl_mutex_ok | blocking_counter_ok
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"

namespace {

int HeapOverflow() {
  auto buf = std::make_unique<char[]>(8);
  volatile int i = 8;
  buf[i] = 1;  // one past the end
  return buf[0];
}

int SignedOverflow(int argc) {
  volatile int big = 2147483647;
  return big + argc;  // argc >= 2 here
}

int Race(bool lock_one_side) {
  absl::Mutex mu;
  int shared = 0;
  std::thread a([&] {
    if (lock_one_side) {
      absl::MutexLock lock(&mu);
      shared = 1;
    } else {
      shared = 1;
    }
  });
  std::thread b([&] { shared = 2; });  // never locks
  a.join();
  b.join();
  return shared == 0;
}

int AbslMutexOk() {
  absl::Mutex mu;
  int shared = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        absl::MutexLock lock(&mu);
        ++shared;
      }
    });
  }
  for (auto& t : threads) t.join();
  return shared == 4000 ? 0 : 1;
}

int BlockingCounterOk() {
  std::vector<int> slots(4, 0);
  absl::BlockingCounter done(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      slots[t] = t + 1;  // published by DecrementCount, read after Wait
      done.DecrementCount();
    });
  }
  done.Wait();
  int sum = 0;
  for (int v : slots) sum += v;
  for (auto& t : threads) t.join();
  return sum == 10 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: canary MODE\n");
    return 2;
  }
  const char* mode = argv[1];
  if (!std::strcmp(mode, "heap_overflow")) return HeapOverflow();
  if (!std::strcmp(mode, "signed_overflow")) return SignedOverflow(argc) == 0;
  if (!std::strcmp(mode, "race")) return Race(false);
  if (!std::strcmp(mode, "race_one_side_locked")) return Race(true);
  if (!std::strcmp(mode, "absl_mutex_ok")) return AbslMutexOk();
  if (!std::strcmp(mode, "blocking_counter_ok")) return BlockingCounterOk();
  std::fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
