// Raw gRPC calls for tests: a request body sent as the bytes given, so a test can send what no generated stub
// would (garbage, a string field that is not UTF-8) and see the server's answer. Header-only, shared by the
// worker and coordinator tests.
#pragma once

#include <chrono>
#include <string>

#include "absl/synchronization/notification.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"

namespace dsv4::testing {

// A unary call to `method` ("/dsv4.v1.Worker/GetLoad") whose request body is `bytes`. A server-streaming
// method answered with an error before any message works the same way.
inline grpc::Status RawUnaryCall(const std::string& address, const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// A GenerateRequest body that is valid but for its request_id, which is not UTF-8: request_id (1) = C3 28 (a
// lead byte without its continuation), prompt_token_ids (2, packed) = 5 6 7, sampling (3) = {max_new_tokens (6)
// = 4}. Bytes 2..3 replaced by "ab" give the encoding of that request with request_id "ab".
inline std::string GenerateRequestWithBadUtf8() {
  return std::string("\x0a\x02\xc3\x28\x12\x03\x05\x06\x07\x1a\x02\x30\x04", 13);
}

}  // namespace dsv4::testing
