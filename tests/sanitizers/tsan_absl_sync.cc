// ThreadSanitizer annotations for Debian's abseil synchronization library (LD_PRELOADed by scripts/sanitize.sh in
// the ThreadSanitizer run; see docs/security.md "Fuzzing and sanitizers").
//
// Why: libabsl_synchronization.so is not built with -fsanitize=thread, so TSan cannot see absl::Mutex, CondVar or
// Notification synchronise anything (their fast paths are atomics inside the uninstrumented library). Every field
// our worker and coordinator guard with an absl::Mutex would then be reported as a race. An abseil built with TSan
// annotates itself with the __tsan_mutex_* interface; this library does the same from outside: it defines the
// public, out-of-line Mutex/CondVar/Notification/BlockingCounter functions, tells TSan what each one does to the lock, and calls
// the real function (found with dlsym(RTLD_NEXT)). Being preloaded, it also catches the calls gRPC makes.
//
// As in abseil's own TSan build, memory accesses inside the real functions are ignored (between pre_* and post_*):
// those include the Condition callbacks absl evaluates on behalf of waiting threads, which hold the lock in
// reality but not in TSan's model.
//
// Built without TSan instrumentation and with weak references to the TSan interface, so a non-TSan process that
// inherits LD_PRELOAD (python3, openssl run by a test) loads it harmlessly.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" {
void __tsan_mutex_pre_lock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_lock(void* addr, unsigned flags, int recursion) __attribute__((weak));
int __tsan_mutex_pre_unlock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_unlock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
}

namespace {

// Flag values of <sanitizer/tsan_interface.h>.
constexpr unsigned kReadLock = 1 << 3;
constexpr unsigned kTryLock = 1 << 4;
constexpr unsigned kTryLockFailed = 1 << 5;

#define DSV4_STR2(x) #x
#define DSV4_STR(x) DSV4_STR2(x)

// "_ZN4absl" + <len><inline namespace> + rest: the mangled name of an absl:: member in this abseil build.
template <typename F>
F Real(const char* prefix, const char* rest) {
  const std::string ns = DSV4_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(prefix) + "4absl" + std::to_string(ns.size()) + ns + rest;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in the next library\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

// Calls nest: the real WaitWithTimeout calls WaitWithDeadline, Notification's waits call Mutex::LockWhen, and so
// on, through the same preloaded symbols. Only the outermost call is annotated; inner ones pass straight through.
thread_local int depth = 0;
struct Nested {
  Nested() { ++depth; }
  ~Nested() { --depth; }
};

bool Tsan() { return __tsan_mutex_pre_lock != nullptr && depth == 0; }

void PreLock(const void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_pre_lock(const_cast<void*>(mu), flags);
}
void PostLock(const void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_post_lock(const_cast<void*>(mu), flags, 0);
}
void PreUnlock(const void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_pre_unlock(const_cast<void*>(mu), flags);
}
void PostUnlock(const void* mu, unsigned flags) {
  if (Tsan()) __tsan_mutex_post_unlock(const_cast<void*>(mu), flags);
}

// A call that releases `mu` and holds it again on return (Await*, CondVar::Wait*): modelled as an unlock before
// and a lock after, with the real call (and any condition it evaluates) inside the ignored unlock window.
template <typename Call>
auto Inside(Call call) {
  Nested nested;
  return call();
}

template <typename Call>
auto ReleaseAndReacquire(const void* mu, unsigned flags, Call call) {
  PreUnlock(mu, flags);
  auto result = Inside(call);
  PostUnlock(mu, flags);
  PreLock(mu, flags);
  PostLock(mu, flags);
  return result;
}

template <typename Call>
auto Locking(const void* mu, unsigned flags, Call call) {
  PreLock(mu, flags);
  auto result = Inside(call);
  PostLock(mu, flags);
  return result;
}

struct Unit {};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex: exclusive ----
void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex4LockEv");
  Locking(this, 0, [&] { real(this); return Unit{}; });
}
void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex6UnlockEv");
  PreUnlock(this, 0);
  Inside([&] { real(this); return Unit{}; });
  PostUnlock(this, 0);
}
bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex7TryLockEv");
  PreLock(this, kTryLock);
  const bool ok = Inside([&] { return real(this); });
  PostLock(this, kTryLock | (ok ? 0 : kTryLockFailed));
  return ok;
}
void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { real(this, cond); return Unit{}; });
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "_ZN", "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

// ---- Mutex: shared ----
void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex10ReaderLockEv");
  Locking(this, kReadLock, [&] { real(this); return Unit{}; });
}
void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex12ReaderUnlockEv");
  PreUnlock(this, kReadLock);
  Inside([&] { real(this); return Unit{}; });
  PostUnlock(this, kReadLock);
}
bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex13ReaderTryLockEv");
  PreLock(this, kReadLock | kTryLock);
  const bool ok = Inside([&] { return real(this); });
  PostLock(this, kReadLock | kTryLock | (ok ? 0 : kTryLockFailed));
  return ok;
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, kReadLock, [&] { real(this, cond); return Unit{}; });
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "_ZN", "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, kReadLock, [&] { return real(this, cond, timeout); });
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN", "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, kReadLock, [&] { return real(this, cond, deadline); });
}

// ---- Mutex: waiting while held (assumed held exclusively, as everywhere in this code base) ----
void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex5AwaitERKNS0_9ConditionE");
  ReleaseAndReacquire(this, 0, [&] { real(this, cond); return Unit{}; });
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "_ZN", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return ReleaseAndReacquire(this, 0, [&] { return real(this, cond, timeout); });
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return ReleaseAndReacquire(this, 0, [&] { return real(this, cond, deadline); });
}

// ---- CondVar ----
void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("_ZN", "7CondVar4WaitEPNS0_5MutexE");
  ReleaseAndReacquire(mu, 0, [&] { real(this, mu); return Unit{}; });
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "_ZN", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return ReleaseAndReacquire(mu, 0, [&] { return real(this, mu, timeout); });
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "_ZN", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return ReleaseAndReacquire(mu, 0, [&] { return real(this, mu, deadline); });
}

// ---- Notification: Notify happens before every wait that returns notified ----
void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("_ZN", "12Notification6NotifyEv");
  if (Tsan()) __tsan_release(this);
  Inside([&] { real(this); return Unit{}; });
}
void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>("_ZNK", "12Notification19WaitForNotificationEv");
  const bool outer = Tsan();
  Inside([&] { real(this); return Unit{}; });
  if (outer) __tsan_acquire(const_cast<Notification*>(this));
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "_ZNK", "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool outer = Tsan();
  const bool notified = Inside([&] { return real(this, timeout); });
  if (outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "_ZNK", "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool outer = Tsan();
  const bool notified = Inside([&] { return real(this, deadline); });
  if (outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

// ---- BlockingCounter: every DecrementCount happens before Wait returns (the counter itself is an atomic inside
// the library, so only the last decrementer would otherwise be ordered before the waiter) ----
bool BlockingCounter::DecrementCount() {
  static auto real = Real<bool (*)(BlockingCounter*)>("_ZN", "15BlockingCounter14DecrementCountEv");
  if (Tsan()) __tsan_release(this);
  return Inside([&] { return real(this); });
}
void BlockingCounter::Wait() {
  static auto real = Real<void (*)(BlockingCounter*)>("_ZN", "15BlockingCounter4WaitEv");
  const bool outer = Tsan();
  Inside([&] { real(this); return Unit{}; });
  if (outer) __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
