// See service.h.
#include "worker/service.h"

#include <deque>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/raw_rpc.h"

namespace dsv4::worker {
namespace {

using dsv4::v1::GenerateResponse;

class GenerateReactor;

// The engine's handle on one call. It outlives the reactor when the engine still holds it after the call ended;
// then it drops whatever it is given.
class StreamSink final : public RequestSink {
 public:
  explicit StreamSink(GenerateReactor* reactor) : reactor_(reactor) {}
  void OnResponse(GenerateResponse response, bool last) override;
  // The call ends with `status` instead of OK after the final message (the group lost a rank: UNAVAILABLE).
  void OnFailure(const absl::Status& status) override;
  // Reactor side: the write of the front message finished.
  void OnWriteDone(bool ok);
  // Reactor side: the client went away.
  void OnCancel();
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  // Starts the next write or the Finish, if one is due. Called with mu_ held; the gRPC call happens after
  // unlocking (StartWrite may run reactions inline).
  enum class Next { kNothing, kWrite, kFinishOk, kFinishCancelled, kFinishFailed };
  Next PickNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(Next next, GenerateReactor* reactor);

  absl::Mutex mu_;
  GenerateReactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool got_last_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // set by OnFailure; the call's final status when not OK
  grpc::ByteBuffer in_flight_;  // the front of queue_, encoded, while its write is in flight
};

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(Engine* engine, const dsv4::v1::GenerateRequest& request)
      : engine_(engine), sink_(std::make_shared<StreamSink>(this)) {
    absl::StatusOr<uint64_t> handle = engine_->Submit(request, sink_);
    if (!handle.ok()) {
      DSV4_LOG_INFO("req={} rejected: {}", request.request_id(), handle.status().ToString());
      sink_->Detach();
      Finish(ToGrpcStatus(handle.status()));
      return;
    }
    handle_ = *handle;
  }
  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override {
    if (handle_ != 0) engine_->Cancel(handle_);
    sink_->OnCancel();
  }
  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  Engine* engine_;
  std::shared_ptr<StreamSink> sink_;
  uint64_t handle_ = 0;
};

void StreamSink::OnResponse(GenerateResponse response, bool last) {
  Next next;
  GenerateReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_ || got_last_) return;
    queue_.push_back(std::move(response));
    got_last_ = last;
    next = PickNext();
    reactor = reactor_;
  }
  Act(next, reactor);
}

void StreamSink::OnFailure(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = status;
}

void StreamSink::OnWriteDone(bool ok) {
  Next next;
  GenerateReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) cancelled_ = true;
    next = PickNext();
    reactor = reactor_;
  }
  Act(next, reactor);
}

void StreamSink::OnCancel() {
  Next next;
  GenerateReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    next = PickNext();
    reactor = reactor_;
  }
  Act(next, reactor);
}

StreamSink::Next StreamSink::PickNext() {
  if (reactor_ == nullptr || writing_ || finished_) return Next::kNothing;
  if (cancelled_) {
    finished_ = true;
    return Next::kFinishCancelled;
  }
  if (!queue_.empty()) {
    writing_ = true;
    SerializeTo(queue_.front(), &in_flight_);  // written only here, under mu_, while no write is in flight
    return Next::kWrite;
  }
  if (got_last_) {
    finished_ = true;
    return failure_.ok() ? Next::kFinishOk : Next::kFinishFailed;
  }
  return Next::kNothing;
}

void StreamSink::Act(Next next, GenerateReactor* reactor) {
  // The reactor stays alive here: OnDone only follows a Finish, and only Act issues Finish.
  switch (next) {
    case Next::kNothing: return;
    case Next::kWrite: reactor->StartWrite(&in_flight_); return;
    case Next::kFinishOk: reactor->Finish(grpc::Status::OK); return;
    case Next::kFinishCancelled:
      reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "generate call cancelled"));
      return;
    case Next::kFinishFailed: {
      absl::Status failure;
      {
        absl::MutexLock lock(&mu_);
        failure = failure_;
      }
      reactor->Finish(ToGrpcStatus(failure));
      return;
    }
  }
}

constexpr char kNotReady[] = "worker is starting: the engine is not up yet";

// A Generate answered at once with `status`: a request that did not decode, or no engine yet (a group still
// forming; health is NOT_SERVING then).
class RefusedReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

using GetLoadCall = UnaryCall<dsv4::v1::GetLoadRequest, dsv4::v1::GetLoadResponse>;
using DrainCall = UnaryCall<dsv4::v1::DrainRequest, dsv4::v1::DrainResponse>;
using RendezvousCall = UnaryCall<dsv4::v1::RendezvousRequest, dsv4::v1::RendezvousResponse>;
using ModelInfoCall = UnaryCall<dsv4::v1::GetModelInfoRequest, dsv4::v1::GetModelInfoResponse>;

}  // namespace

WorkerService::WorkerService(Engine* engine, ServiceOptions options)
    : engine_(engine), options_(std::move(options)) {}

template <typename Call>
Engine* WorkerService::EngineOrReply(Call* call) const {
  Engine* engine = engine_.load(std::memory_order_acquire);
  if (engine == nullptr) call->Reply(grpc::Status(grpc::StatusCode::UNAVAILABLE, kNotReady));
  return engine;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerService::Generate(grpc::CallbackServerContext* context,
                                                                    const grpc::ByteBuffer* bytes) {
  dsv4::v1::GenerateRequest request;
  if (absl::Status parsed = ParseRequest(*bytes, &request); !parsed.ok()) {
    return new RefusedReactor(ToGrpcStatus(parsed));
  }
  Engine* engine = engine_.load(std::memory_order_acquire);
  if (engine == nullptr) return new RefusedReactor(grpc::Status(grpc::StatusCode::UNAVAILABLE, kNotReady));
  return new GenerateReactor(engine, request);
}

grpc::ServerUnaryReactor* WorkerService::GetLoad(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                                 grpc::ByteBuffer* out) {
  auto* call = new GetLoadCall(in, out);
  if (!call->parsed()) return call;
  Engine* engine = EngineOrReply(call);
  if (engine == nullptr) return call;
  *call->response() = engine->GetLoad();
  call->Reply(grpc::Status::OK);
  return call;
}

grpc::ServerUnaryReactor* WorkerService::Drain(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out) {
  auto* call = new DrainCall(in, out);
  if (!call->parsed()) return call;
  Engine* engine = EngineOrReply(call);
  if (engine == nullptr) return call;
  const double requested = call->request().timeout_s();
  const double timeout_s = requested > 0 ? requested : options_.default_drain_timeout_s;
  DSV4_LOG_INFO("drain requested (timeout {:.1f} s)", timeout_s);
  if (options_.on_drain) options_.on_drain();
  engine->Drain(absl::Seconds(timeout_s), [call](int finished, int aborted) {
    call->response()->set_finished(finished);
    call->response()->set_aborted(aborted);
    call->Reply(grpc::Status::OK);
  });
  return call;
}

grpc::ServerUnaryReactor* WorkerService::Rendezvous(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  auto* call = new RendezvousCall(in, out);
  if (!call->parsed()) return call;
  if (options_.rendezvous) {
    call->Reply(ToGrpcStatus(options_.rendezvous(call->request(), call->response())));
    return call;
  }
  const int rank = call->request().rank();
  call->Reply(grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      options_.world == 1
          ? absl::StrCat("this worker runs --world 1: no followers can join (rendezvous from rank ", rank,
                         " refused)")
          : absl::StrCat("this worker is a follower, not the leader (rank 0) of its group: rendezvous from rank ",
                         rank, " refused; point --leader at rank 0")));
  return call;
}

grpc::ServerUnaryReactor* WorkerService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  auto* call = new ModelInfoCall(in, out);
  if (!call->parsed()) return call;
  Engine* engine = EngineOrReply(call);
  if (engine == nullptr) return call;
  const ModelInfo& info = engine->model_info();
  dsv4::v1::GetModelInfoResponse* response = call->response();
  response->set_model_name(info.model_name);
  response->set_vocab_size(info.vocab_size);
  response->set_max_context(options_.max_context);
  response->set_eos_token_id(info.eos_token_ids.empty() ? -1 : info.eos_token_ids[0]);
  response->set_bos_token_id(info.bos_token_id);
  response->set_num_layers(info.num_layers);
  response->set_weight_format(info.weight_format);
  response->set_checkpoint_fingerprint(info.checkpoint_fingerprint);
  call->Reply(grpc::Status::OK);
  return call;
}

}  // namespace dsv4::worker
