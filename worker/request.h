// One generation request inside the engine, and its lifecycle.
//
//              admit (slot + pages for the first chunk)        prompt fully cached, first token sampled
//   kWaiting ──────────────────────────────────────▶ kPrefill ─────────────────────────────────────▶ kDecode
//      ▲  ▲                                              │                                            │
//      │  └──────────── preempt (newest running request when pages run short: every page and the slot
//      │                 are returned; prompt + generated tokens are recomputed on re-admission) ◀────┘
//      │
//   Submit                     kDecode ── eos / stop token / max_new_tokens ──▶ kFinished
//                              any state ── client cancel, drain timeout ──────▶ kAborted
//                              kPrefill/kDecode ── forward error ──────────────▶ kFailed
//
// Terminal states (kFinished, kAborted, kFailed) hold no pages: the engine releases them before the final
// response is sent. Preemption keeps the arrival number, so FCFS order survives it.
//
// Threads: a Request is owned by the engine thread; the sink is the only thing other threads see.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dsv4/v1/generate.pb.h"
#include "worker/model_executor.h"
#include "worker/sampler.h"

namespace dsv4::worker {

enum class RequestState { kWaiting, kPrefill, kDecode, kFinished, kAborted, kFailed };
const char* RequestStateName(RequestState s);

// Where a request's output goes. Called on the engine thread only; implementations must not block
// (the gRPC reactor queues the message and returns).
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // New token ids; `last` responses carry finish_reason and usage.
  virtual void OnResponse(dsv4::v1::GenerateResponse response, bool last) = 0;
  // Called before the final response when the request failed for a reason the caller should see as the call's
  // status (a tensor-parallel group lost a rank: UNAVAILABLE, retry elsewhere). Default: ignored.
  virtual void OnFailure(const absl::Status& /*status*/) {}
};

struct Request {
  uint64_t handle = 0;   // engine-unique id (client request_ids may repeat)
  uint64_t arrival = 0;  // FCFS order; kept across preemption
  std::string request_id;
  std::vector<int32_t> tokens;  // prompt followed by every generated token
  int prompt_tokens = 0;        // the original prompt (resumed tokens excluded)
  int generated = 0;            // generated tokens, resumed ones included; next sample uses counter `generated`
  int num_computed = 0;         // leading tokens whose KV is cached
  int max_new_tokens = 0;
  SamplingConfig sampling;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;  // stream each token's log-probability (and top_logprobs alternatives)
  int top_logprobs = 0;
  dsv4::v1::TokenLogprob last_logprob;  // of the last sampled token, for the response that carries it
  RequestState state = RequestState::kWaiting;
  BlockTables tables;
  bool needs_state_reset = false;  // set on admission: the slot's compressor state is stale
  int preemptions = 0;
  std::shared_ptr<RequestSink> sink;

  absl::Time arrival_time;
  absl::Time first_token_time = absl::InfinitePast();
  absl::Time last_token_time = absl::InfinitePast();

  bool running() const { return state == RequestState::kPrefill || state == RequestState::kDecode; }
  int remaining_to_compute() const { return static_cast<int>(tokens.size()) - num_computed; }
};

}  // namespace dsv4::worker
