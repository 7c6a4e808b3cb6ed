// FakeWorker: an in-process dsv4.v1.Worker server for coordinator tests, standing in for a worker group
// leader without the model. It streams deterministic tokens (FakeNextToken: a hash of the whole sequence so
// far and, for sampled requests, the seed, so a failover that lost, duplicated or reordered a token, or
// changed the seed, produces a different continuation), honours cancellation, reports a scriptable load,
// can die mid-stream the way a killed process does (its server shuts down, cutting every stream), and can
// freeze the way a SIGSTOPped process does (streams and GetLoad stall until Thaw; a cancel that arrived while
// frozen is seen on thaw, like a resumed process reading the RST_STREAM) or only its streams (an engine hung
// behind RPC threads that still answer GetLoad, whose heartbeat - seconds_since_progress - then grows).
//
// Threads: the synchronous gRPC server runs each stream on its own thread (fine for a test double);
// counters are atomics or mutex-guarded; Kill() may be called from any thread except a handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/server.h"

namespace dsv4::testing {

struct FakeWorkerOptions {
  int vocab_size = 1000;
  int max_context = 4096;
  int eos_token_id = 1;
  absl::Duration step = absl::Milliseconds(2);  // time per generated token
  int die_after_tokens = -1;  // > 0: the process "dies" after streaming this many tokens in total
  bool queue_full = false;    // every Generate answers RESOURCE_EXHAUSTED (a full waiting queue)
  std::string checkpoint = "fnv1a64:fake";  // GetModelInfo's checkpoint_fingerprint
};

// The log-probability the fake reports for a streamed token (sampling.logprobs), and for top alternative k.
float FakeLogprob(int32_t token);
// The fake's token after `sequence` (prompt + generated so far); `seed` is used only when sampled.
int32_t FakeNextToken(const std::vector<int32_t>& sequence, bool sampled, uint64_t seed, int vocab_size);
// The fake's whole generation for a prompt (no stop tokens, no eos): what an uninterrupted run streams.
std::vector<int32_t> FakeGeneration(std::vector<int32_t> prompt, int max_new_tokens, bool sampled, uint64_t seed,
                                    int vocab_size);

class FakeWorker {
 public:
  explicit FakeWorker(FakeWorkerOptions options);
  ~FakeWorker();

  std::string address() const { return address_; }

  // Shuts the server down at once: every open stream is cut, every later RPC fails to connect.
  void Kill();

  // The load GetLoad reports on top of the live streams (running counts them itself).
  void SetLoad(const dsv4::v1::GetLoadResponse& extra);
  void SetDraining(bool draining);
  // What GetModelInfo answers from now on (a process restarted at the same address on another checkpoint).
  void SetCheckpoint(const std::string& fingerprint);

  // Freeze: no stream produces a token and, unless streams_only, GetLoad does not answer, until Thaw.
  void Freeze(bool streams_only = false);
  void Thaw();

  int generate_calls() const { return generate_calls_.load(); }
  int active() const { return active_.load(); }
  int cancelled() const { return cancelled_.load(); }
  int completed() const { return completed_.load(); }
  std::vector<dsv4::v1::GenerateRequest> requests() const;

 private:
  class Service;
  const FakeWorkerOptions options_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<int> generate_calls_{0}, active_{0}, cancelled_{0}, completed_{0}, streamed_{0};
  std::atomic<bool> killed_{false};
  std::atomic<bool> streams_frozen_{false}, load_frozen_{false};
  mutable absl::Mutex mu_;
  dsv4::v1::GetLoadResponse extra_load_ ABSL_GUARDED_BY(mu_);
  absl::Time frozen_at_ ABSL_GUARDED_BY(mu_);   // GetLoad's seconds_since_progress counts from here
  std::string checkpoint_ ABSL_GUARDED_BY(mu_);  // GetModelInfo's checkpoint_fingerprint
  std::vector<dsv4::v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::thread killer_;  // Kill() from inside a handler runs here
};

}  // namespace dsv4::testing
