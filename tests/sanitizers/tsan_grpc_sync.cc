// ThreadSanitizer annotations for gRPC's completion queues (preloaded with tsan_absl_sync.cc in the TSan run of
// scripts/sanitize.sh; see docs/security.md "Fuzzing and sanitizers").
//
// gRPC (Debian's, not built with TSan) runs a batch started on one thread (grpc_call_start_batch) and reports its
// completion on another, through queues TSan cannot see. gRPC's contract is that everything before starting a
// batch happens before the completion is delivered with the batch's tag: the callback API relies on it between
// e.g. StartRead and OnReadDone, and so does our reactor code that hands state from one callback to the next
// without a lock. This adds exactly that edge: a release on the tag when a batch starts, an acquire on the tag
// when a completion queue returns it (grpc++ runs callback-API reactors from grpc_completion_queue_next).
//
// Uninstrumented, with weak references to the TSan interface, like tsan_absl_sync.cc.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "grpc/grpc.h"

extern "C" {
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
}

namespace {

template <typename F>
F Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_grpc_sync: %s not found in the next library\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

void Acquired(const grpc_event& ev) {
  if (__tsan_acquire != nullptr && ev.type == GRPC_OP_COMPLETE && ev.tag != nullptr) __tsan_acquire(ev.tag);
}

}  // namespace

extern "C" grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops, void* tag,
                                                 void* reserved) {
  static auto real = Real<grpc_call_error (*)(grpc_call*, const grpc_op*, size_t, void*, void*)>(
      "grpc_call_start_batch");
  if (__tsan_release != nullptr && tag != nullptr) __tsan_release(tag);
  return real(call, ops, nops, tag, reserved);
}

extern "C" grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline, void* reserved) {
  static auto real = Real<grpc_event (*)(grpc_completion_queue*, gpr_timespec, void*)>("grpc_completion_queue_next");
  const grpc_event ev = real(cq, deadline, reserved);
  Acquired(ev);
  return ev;
}

extern "C" grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag, gpr_timespec deadline,
                                                  void* reserved) {
  static auto real =
      Real<grpc_event (*)(grpc_completion_queue*, void*, gpr_timespec, void*)>("grpc_completion_queue_pluck");
  const grpc_event ev = real(cq, tag, deadline, reserved);
  Acquired(ev);
  return ev;
}
