// dsv4-bench's load loop: sends BenchRequests to a dsv4.v1.Coordinator (or a Worker's identical Generate)
// with at most `concurrency` in flight, either back to back or arriving as a Poisson process of
// `request_rate` requests/s, and records each request's timings.
//
// Threads: the calling thread launches requests and waits; gRPC's callback threads run each stream's
// reactor (no thread per request), so thousands of in-flight requests cost no threads.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "bench/serving/stats.h"
#include "bench/serving/workload.h"
#include "dsv4/v1/coordinator.grpc.pb.h"

namespace dsv4::bench {

struct RunOptions {
  int concurrency = 1;        // max requests in flight
  double request_rate = 0;    // Poisson arrivals per second; 0 = send as soon as a slot frees
  float temperature = 0;      // 0 = greedy
  int top_logprobs = -1;      // >= 0: every request asks for log-probabilities with this many alternatives
  uint64_t seed = 1;          // arrival times and per-request sampling seeds
  absl::Duration request_timeout = absl::Minutes(10);
};

// Runs every request once; `duration_s` receives the wall time from the first send to the last answer.
std::vector<RequestRecord> RunBenchmark(dsv4::v1::Coordinator::Stub& stub, const std::vector<BenchRequest>& requests,
                                        const RunOptions& options, double* duration_s);

}  // namespace dsv4::bench
