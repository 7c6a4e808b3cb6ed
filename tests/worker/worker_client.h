// Client-side helpers of the tests that drive a real dsv4-worker over gRPC (integration_test.cc on the CPU backend,
// gpu_worker_test.cc and tp_gpu_test.cc on the CUDA backend): requests, streaming them (alone or many at once),
// dsv4-generate's greedy tokens as the reference, deterministic prompts, KV page usage from GetLoad.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace dsv4::worker::testing {

struct Stream {
  std::vector<int32_t> tokens;
  std::vector<dsv4::v1::TokenLogprob> logprobs;  // sampling.logprobs: one per token
  dsv4::v1::GenerateResponse last;
  grpc::Status status;
};

// A request that ignores eos (dsv4-generate does not stop at it either); temperature > 0: top-p 0.95 with `seed`.
dsv4::v1::GenerateRequest Request(std::vector<int32_t> prompt, int max_new, float temperature = 0, uint64_t seed = 0);
// Streams one request to its end (deadline 300 s).
Stream Generate(dsv4::v1::Worker::Stub* stub, const dsv4::v1::GenerateRequest& r);
// Every request at once, one thread each; results in request order.
std::vector<Stream> GenerateAll(dsv4::v1::Worker::Stub* stub, const std::vector<dsv4::v1::GenerateRequest>& reqs);
// dsv4-generate's greedy tokens for `prompt` on `checkpoint`, with `extra` flags (e.g. --backend=cuda).
std::vector<int32_t> ReferenceTokens(const std::string& checkpoint, const std::vector<int32_t>& prompt, int max_new,
                                     const std::vector<std::string>& extra = {});
// A deterministic prompt of n tokens in [2, 4002).
std::vector<int32_t> Prompt(int n, int salt);
// KV pages in use over all pools (GetLoad).
int64_t PagesUsed(dsv4::v1::Worker::Stub* stub);
// Waits up to 30 s for every page to be free.
bool WaitPagesFree(dsv4::v1::Worker::Stub* stub);

}  // namespace dsv4::worker::testing
