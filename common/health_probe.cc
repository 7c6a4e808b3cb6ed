// See health_probe.h.
#include "common/health_probe.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"

namespace dsv4 {
namespace {

constexpr char kCheck[] = "/grpc.health.v1.Health/Check";

// Drops the process-wide builder plugins (server reflection) from the probe server: it serves Check only.
class NoPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override { plugins->clear(); }
};

// One probe: read the request, ask the main server, relay its answer (or its error).
class ForwardCheck final : public grpc::ServerGenericBidiReactor {
 public:
  ForwardCheck(grpc::GenericCallbackServerContext* ctx, grpc::GenericStub* upstream) : upstream_(upstream) {
    if (ctx->method() != kCheck) {
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "this port serves only grpc.health.v1.Health/Check (Kubernetes probes); the API is on "
                          "the main port"));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no HealthCheckRequest was sent"));
      return;
    }
    // A probe has its own short timeout; this one only bounds a wedged main server.
    upstream_ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    upstream_->UnaryCall(&upstream_ctx_, kCheck, grpc::StubOptions(), &request_, &response_,
                         [this](grpc::Status s) {
                           if (s.ok()) {
                             StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
                           } else {
                             Finish(s);
                           }
                         });
  }

  void OnDone() override { delete this; }

 private:
  grpc::GenericStub* const upstream_;
  grpc::ClientContext upstream_ctx_;
  grpc::ByteBuffer request_, response_;
};

}  // namespace

class HealthProbeServer::Service final : public grpc::CallbackGenericService {
 public:
  explicit Service(std::shared_ptr<grpc::Channel> main) : upstream_(std::move(main)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new ForwardCheck(ctx, &upstream_);  // deletes itself
  }

 private:
  grpc::GenericStub upstream_;
};

absl::StatusOr<std::unique_ptr<HealthProbeServer>> HealthProbeServer::Start(const std::string& listen,
                                                                          grpc::Server& main) {
  if (listen.empty()) return std::unique_ptr<HealthProbeServer>();
  std::unique_ptr<HealthProbeServer> p(new HealthProbeServer());
  p->service_ = std::make_unique<Service>(main.InProcessChannel(grpc::ChannelArguments()));
  grpc::ServerBuilder builder;
  // No default health service of its own (it would answer SERVING regardless of the main server).
  builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder.SetOption(std::make_unique<NoPlugins>());
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &p->port_);
  builder.RegisterCallbackGenericService(p->service_.get());
  p->server_ = builder.BuildAndStart();
  if (p->server_ == nullptr || p->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--health-listen ", listen, ": cannot listen"));
  }
  DSV4_LOG_INFO("health probe port {}: PLAINTEXT, grpc.health.v1.Health/Check only (for Kubernetes probes)",
                p->port_);
  return p;
}

HealthProbeServer::~HealthProbeServer() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace dsv4
