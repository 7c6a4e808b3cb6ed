// Small helpers shared by the coordinator tests: a blocking Generate client that collects a whole stream,
// and the grpc.health.v1 check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/v1/coordinator.grpc.pb.h"
#include "std_grpc/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace dsv4::testing {

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;      // every token of every chunk, in order
  dsv4::v1::GenerateResponse last;  // the last chunk received (finish_reason, usage)
  int chunks = 0;
  int finish_chunks = 0;            // chunks that carried a finish_reason (must be exactly 1 on success)
};

// Runs one Generate call to the end; cancels it after `cancel_after` tokens when >= 0.
inline StreamResult RunGenerate(dsv4::v1::Coordinator::Stub& stub, const dsv4::v1::GenerateRequest& request,
                                int cancel_after = -1, grpc::ClientContext* ctx_in = nullptr) {
  grpc::ClientContext local;
  grpc::ClientContext& ctx = ctx_in != nullptr ? *ctx_in : local;
  StreamResult r;
  auto reader = stub.Generate(&ctx, request);
  dsv4::v1::GenerateResponse chunk;
  bool cancelled = false;
  while (reader->Read(&chunk)) {
    ++r.chunks;
    r.tokens.insert(r.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    if (chunk.finish_reason() != dsv4::v1::FINISH_REASON_UNSPECIFIED) ++r.finish_chunks;
    r.last = chunk;
    if (!cancelled && cancel_after >= 0 && static_cast<int>(r.tokens.size()) >= cancel_after) {
      ctx.TryCancel();
      cancelled = true;
    }
  }
  r.status = reader->Finish();
  return r;
}

inline std::unique_ptr<dsv4::v1::Coordinator::Stub> CoordinatorStub(const std::string& address) {
  return dsv4::v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// grpc.health.v1 Check for `service` ("" = the whole server); -1 when the call fails.
inline int HealthStatus(const std::string& address, const std::string& service = "") {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return -1;
  return resp.status();
}

inline dsv4::v1::GenerateRequest MakeRequest(std::vector<int32_t> prompt, int max_new_tokens, float temperature = 0) {
  dsv4::v1::GenerateRequest r;
  r.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  r.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  r.mutable_sampling()->set_temperature(temperature);
  return r;
}

// The two streams the failover tests replay across a killed or stopped worker: one greedy, one sampled (top-k 50,
// fixed seed), both `tokens` long (ignore_eos), so the streams finished elsewhere can be compared token for token.
struct FailoverRequests {
  dsv4::v1::GenerateRequest greedy, sampled;
};
inline FailoverRequests MakeFailoverRequests(int tokens) {
  FailoverRequests f{.greedy = MakeRequest({0, 17, 99, 1234, 7, 4000, 3, 250}, tokens),
                     .sampled = MakeRequest({0, 5, 6, 7}, tokens, 0.9f)};
  f.greedy.mutable_sampling()->set_ignore_eos(true);
  f.sampled.mutable_sampling()->set_top_k(50);
  f.sampled.mutable_sampling()->set_seed(20260429);
  f.sampled.mutable_sampling()->set_ignore_eos(true);
  return f;
}

}  // namespace dsv4::testing
