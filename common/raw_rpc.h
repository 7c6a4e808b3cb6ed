// Protobuf requests read by the handler itself (gRPC "raw" callback methods), so that a request that cannot be
// decoded gets INVALID_ARGUMENT saying so, on every dsv4 service method.
//
// Why not typed methods: with a typed callback method gRPC decodes the request before any handler runs and,
// when that fails (bytes that are not a valid message, or a proto3 string field such as request_id that is not
// valid UTF-8), it finishes the call itself with UNIMPLEMENTED and an empty message
// (grpcpp/impl/codegen/server_callback_handlers.h, gRPC 1.51) — no hook lets a service change that. A raw
// method (WithRawCallbackMethod_<Name> in the generated code) hands the handler the bytes; ParseRequest
// decodes them with the same protobuf parser. The wire format, the .proto files and every client stay as they
// are; only the server-side handler signatures take and give grpc::ByteBuffer.
//
// Threads: stateless functions; a UnaryCall is used like the DefaultReactor it replaces (Reply once, from any
// thread).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/grpc_status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"

namespace dsv4 {

// Decodes `bytes` into `message`. INVALID_ARGUMENT "the request could not be parsed as <type> (N bytes): ..."
// naming the message's string fields (an invalid UTF-8 string fails the whole parse) when it cannot.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);

// Encodes `message` into `out` (replacing what it held).
void SerializeTo(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out);

// One unary call on a raw method: the typed request (decoded at construction), the typed response, and Reply,
// which encodes the response into the call's buffer and finishes. A request that does not decode is answered
// at construction with INVALID_ARGUMENT; the handler then just returns the reactor (parsed() is false).
// Deletes itself when gRPC is done with it.
template <typename Request, typename Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(const grpc::ByteBuffer* in, grpc::ByteBuffer* out) : out_(out) {
    const absl::Status parsed = ParseRequest(*in, &request_);
    parsed_ = parsed.ok();
    if (!parsed_) Finish(ToGrpcStatus(parsed));
  }
  bool parsed() const { return parsed_; }
  const Request& request() const { return request_; }
  Response* response() { return &response_; }
  void Reply(const grpc::Status& status) {
    if (status.ok()) SerializeTo(response_, out_);
    Finish(status);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer* const out_;  // owned by gRPC, valid until OnDone
  Request request_;
  Response response_;
  bool parsed_ = false;
};

}  // namespace dsv4
