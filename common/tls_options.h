// TLS for every gRPC endpoint (docs/security.md): file-based options, checked at start-up, turned into gRPC's
// own credentials (grpc::SslServerCredentials, grpc::SslCredentials). Plaintext stays the default; whoever
// builds credentials logs one line saying which it is, so a plaintext process never looks like a secure one.
//
//   server side (dsv4-coordinator, dsv4-worker): --tls-cert, --tls-key, [--tls-client-ca = require and verify
//     client certificates: mutual TLS]
//   client side (coordinator -> workers: --worker-tls-*, follower rank -> leader: --leader-tls-*, dsv4-bench:
//     --tls-*): the CA that signed the server's certificate, optionally a client certificate and key, and the
//     name the server certificate must carry when it differs from the host dialled (pods are dialled by IP).
//
// Files are read once, at start-up: a rotated certificate takes effect on restart. Every error names the flag
// and the file. Thread-safe: the structs are plain values; credentials objects are immutable once built.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace dsv4 {

struct ServerTlsOptions {
  std::string cert_file{};       // --tls-cert: PEM certificate chain (leaf first); empty with key_file = plaintext
  std::string key_file{};        // --tls-key: PEM private key of the leaf certificate
  std::string client_ca_file{};  // --tls-client-ca: require client certificates signed by these CAs (mutual TLS)

  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !client_ca_file.empty(); }
};

struct ClientTlsOptions {
  std::string ca_file{};      // PEM CAs that signed the server's certificate; empty (with the rest) = plaintext
  std::string cert_file{};    // client certificate chain presented to a server that asks (mutual TLS); optional
  std::string key_file{};     // its private key (with cert_file)
  std::string server_name{};  // name the server certificate must carry; empty = the host part of the target
  bool use_tls = false;     // TLS even when no file is set: the system's CA certificates verify the server
  std::string flag_prefix = "--tls-";  // how the caller's flags are spelled, for error messages

  bool enabled() const { return use_tls || !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// Server credentials for AddListeningPort: insecure when `options` is empty, else TLS (after checking that the
// files parse, the key matches the certificate and the certificate is within its validity dates).
// INVALID_ARGUMENT naming the flag otherwise. Logs "<what>: TLS ..." or "<what>: PLAINTEXT ..." once.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsOptions& options,
                                                                            const std::string& what);

// A client's side of a connection: built once from ClientTlsOptions, then used for every channel.
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials{};  // null = plaintext
  std::string server_name{};                                 // see ClientTlsOptions::server_name
  bool tls() const { return credentials != nullptr; }

  // A channel to `target` ("host:port") with these credentials. `verify_as` (when not empty, and no
  // server_name is set) is the name the server certificate must carry instead of the target's host.
  std::shared_ptr<grpc::Channel> Connect(const std::string& target, grpc::ChannelArguments args = {},
                                         const std::string& verify_as = "") const;
};

// Checks the files (as MakeServerCredentials does) and builds the credentials. `bearer_token` (optional) is
// sent on every call as "authorization: Bearer <token>" (gRPC's AccessTokenCredentials); gRPC sends call
// credentials only over TLS, so a token without TLS is INVALID_ARGUMENT. Logs one line when `what` is set.
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const ClientTlsOptions& options, const std::string& what,
                                                    const std::string& bearer_token = "");

// Whole contents of `path`; NOT_FOUND / INVALID_ARGUMENT naming `flag` and the path.
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path);

}  // namespace dsv4
