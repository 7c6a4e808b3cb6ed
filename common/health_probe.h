// HealthProbeServer: a plaintext port answering grpc.health.v1.Health/Check and nothing else, for Kubernetes
// gRPC probes once the main port speaks TLS (the kubelet's gRPC probe cannot do TLS, nor present a client
// certificate). Each Check is forwarded over the main server's in-process channel to its own health service, so
// the probe sees exactly the main server's SERVING / NOT_SERVING, and no second health state exists to keep in
// step. Every other method (Watch, the APIs, reflection) answers UNIMPLEMENTED. See docs/security.md.
//
// Threads: gRPC's callback threads run each probe; nothing blocks. The main server must outlive this object
// (destroy the probe server first).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace dsv4 {

class HealthProbeServer {
 public:
  // Listens on `listen` (host:port, port 0 = any free one). Null with OK when `listen` is empty (no probe port).
  // UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HealthProbeServer>> Start(const std::string& listen, grpc::Server& main);
  ~HealthProbeServer();

  int port() const { return port_; }

 private:
  class Service;
  HealthProbeServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace dsv4
