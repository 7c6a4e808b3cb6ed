// The Worker gRPC service (proto/dsv4/v1/worker.proto) over an Engine, on the gRPC callback API.
//
// Generate: one GenerateReactor per call. The reactor submits the request to the engine (validation errors and
// queue-full come back at once as the call's status) and streams what the engine hands its sink: one message per
// step with the new token ids, the last with finish_reason and usage. Client cancellation (OnCancel) asks the
// engine to abort the request; the engine frees its pages at the next step boundary.
// Rendezvous: delegates to options.rendezvous (the group leader's comm::RendezvousLeader::Handle).
// GetLoad, GetModelInfo, Drain, Rendezvous: unary reactors that never wait on the engine (Drain's reply is sent
// from the engine thread when the drain completes).
//
// Every method is raw (common/raw_rpc.h): the handlers decode the request bytes themselves, so a request that
// does not decode gets INVALID_ARGUMENT saying so instead of gRPC's own UNIMPLEMENTED with no message.
//
// Threads: reactions run on gRPC's callback threads; the engine calls sinks on its own thread. The per-call
// StreamSink mutex serialises the two; no reaction blocks.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "dsv4/v1/worker.grpc.pb.h"
#include "worker/engine.h"

namespace dsv4::worker {

struct ServiceOptions {
  int max_context = 4096;
  int world = 1;
  double default_drain_timeout_s = 30;
  std::function<void()> on_drain;  // called when a Drain starts (the process flips health to NOT_SERVING)
  // The Worker.Rendezvous body (comm::RendezvousLeader::Handle on a group's leader; must not block). Unset:
  // every rendezvous is refused with FAILED_PRECONDITION (world 1, or a follower: it is not the leader).
  std::function<absl::Status(const dsv4::v1::RendezvousRequest&, dsv4::v1::RendezvousResponse*)> rendezvous;
};

// dsv4.v1.Worker with every method raw (bytes in, bytes out).
using RawWorkerService = dsv4::v1::Worker::WithRawCallbackMethod_Generate<
    dsv4::v1::Worker::WithRawCallbackMethod_GetLoad<dsv4::v1::Worker::WithRawCallbackMethod_Drain<
        dsv4::v1::Worker::WithRawCallbackMethod_Rendezvous<
            dsv4::v1::Worker::WithRawCallbackMethod_GetModelInfo<dsv4::v1::Worker::Service>>>>>;

class WorkerService final : public RawWorkerService {
 public:
  // `engine` may be null while a group forms (the server must be up for followers to rendezvous): until
  // AttachEngine, Generate, GetLoad, GetModelInfo and Drain answer UNAVAILABLE.
  WorkerService(Engine* engine, ServiceOptions options);
  void AttachEngine(Engine* engine) { engine_.store(engine, std::memory_order_release); }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  // The engine, or nullptr after answering UNAVAILABLE "still starting" on `call` when none is attached yet.
  template <typename Call>
  Engine* EngineOrReply(Call* call) const;

  std::atomic<Engine*> engine_;
  ServiceOptions options_;
};

}  // namespace dsv4::worker
