// See tls_options.h. The PEM checks use OpenSSL (the library gRPC itself links on Debian) so a wrong file fails
// start-up with a line naming it, instead of every handshake failing later with a generic error.
#include "common/tls_options.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"

namespace dsv4 {
namespace {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

// The certificates in a PEM text, in order; INVALID_ARGUMENT naming the flag when there is none.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& flag, const std::string& path,
                                                       const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  std::vector<X509Ptr> out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the read that ends the loop leaves "no start line" on the error queue
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": no PEM certificate in the file"));
  }
  return out;
}

// Refuses a certificate outside its validity dates: peers would refuse it at every handshake anyway.
absl::Status CheckDates(const std::string& flag, const std::string& path, X509* cert) {
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": the certificate is not valid yet"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": the certificate has expired"));
  }
  return absl::OkStatus();
}

// A certificate chain and its key: both parse, the key belongs to the leaf, the leaf is in date.
absl::Status CheckKeyPair(const std::string& cert_flag, const std::string& cert_path, const std::string& cert_pem,
                          const std::string& key_flag, const std::string& key_path, const std::string& key_pem) {
  DSV4_ASSIGN_OR_RETURN(std::vector<X509Ptr> chain, ParseCertificates(cert_flag, cert_path, cert_pem));
  DSV4_RETURN_IF_ERROR(CheckDates(cert_flag, cert_path, chain.front().get()));
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  std::unique_ptr<EVP_PKEY, KeyFree> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, " ", key_path, ": no unencrypted PEM private key in the file"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, " ", key_path, " is not the key of the certificate in ", cert_flag, " ", cert_path));
  }
  return absl::OkStatus();
}

// Both or neither of a certificate and its key.
absl::Status NeedBoth(const std::string& cert_flag, const std::string& cert, const std::string& key_flag,
                      const std::string& key) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(cert.empty() ? cert_flag : key_flag, " is required with ",
                                                   cert.empty() ? key_flag : cert_flag));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot open the file"));
  std::stringstream s;
  s << f.rdbuf();
  if (f.bad()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": read error"));
  return s.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsOptions& o,
                                                                            const std::string& what) {
  if (!o.enabled()) {
    DSV4_LOG_INFO("{}: PLAINTEXT (no TLS, anyone who reaches the port can connect; set --tls-cert and --tls-key)",
                  what);
    return grpc::InsecureServerCredentials();
  }
  if (o.cert_file.empty() || o.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS needs both --tls-cert and --tls-key", o.client_ca_file.empty() ? "" : " (--tls-client-ca is set)"));
  }
  DSV4_ASSIGN_OR_RETURN(std::string cert, ReadSecretFile("--tls-cert", o.cert_file));
  DSV4_ASSIGN_OR_RETURN(std::string key, ReadSecretFile("--tls-key", o.key_file));
  DSV4_RETURN_IF_ERROR(CheckKeyPair("--tls-cert", o.cert_file, cert, "--tls-key", o.key_file, key));
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({.private_key = std::move(key), .cert_chain = std::move(cert)});
  if (!o.client_ca_file.empty()) {
    DSV4_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSecretFile("--tls-client-ca", o.client_ca_file));
    DSV4_RETURN_IF_ERROR(ParseCertificates("--tls-client-ca", o.client_ca_file, ssl.pem_root_certs).status());
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  DSV4_LOG_INFO("{}: TLS (certificate {}{})", what, o.cert_file,
                o.client_ca_file.empty() ? ", client certificates not requested"
                                         : absl::StrCat(", mutual TLS: client certificates required, signed by ",
                                                        o.client_ca_file));
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const ClientTlsOptions& o, const std::string& what,
                                                    const std::string& bearer_token) {
  const std::string ca_flag = o.flag_prefix + "ca", cert_flag = o.flag_prefix + "cert",
                    key_flag = o.flag_prefix + "key";
  if (!o.enabled()) {
    if (!bearer_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a bearer token is sent only over TLS (gRPC refuses call credentials on a plaintext channel); set ",
          ca_flag));
    }
    if (!what.empty()) DSV4_LOG_INFO("{}: PLAINTEXT (no TLS; set {} to verify the server)", what, ca_flag);
    return ChannelSecurity{};
  }
  DSV4_RETURN_IF_ERROR(NeedBoth(cert_flag, o.cert_file, key_flag, o.key_file));
  grpc::SslCredentialsOptions ssl;
  if (!o.ca_file.empty()) {
    DSV4_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSecretFile(ca_flag, o.ca_file));
    DSV4_RETURN_IF_ERROR(ParseCertificates(ca_flag, o.ca_file, ssl.pem_root_certs).status());
  }
  if (!o.cert_file.empty()) {
    DSV4_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadSecretFile(cert_flag, o.cert_file));
    DSV4_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadSecretFile(key_flag, o.key_file));
    DSV4_RETURN_IF_ERROR(
        CheckKeyPair(cert_flag, o.cert_file, ssl.pem_cert_chain, key_flag, o.key_file, ssl.pem_private_key));
  }
  ChannelSecurity out{.credentials = grpc::SslCredentials(ssl), .server_name = o.server_name};
  if (!bearer_token.empty()) {
    out.credentials = grpc::CompositeChannelCredentials(out.credentials, grpc::AccessTokenCredentials(bearer_token));
  }
  if (!what.empty()) {
    DSV4_LOG_INFO("{}: TLS (server verified against {}{}{})", what,
                  o.ca_file.empty() ? "the system's CA certificates" : o.ca_file,
                  o.server_name.empty() ? "" : absl::StrCat(" as '", o.server_name, "'"),
                  o.cert_file.empty() ? ", no client certificate" : absl::StrCat(", client certificate ", o.cert_file));
  }
  return out;
}

std::shared_ptr<grpc::Channel> ChannelSecurity::Connect(const std::string& target, grpc::ChannelArguments args,
                                                        const std::string& verify_as) const {
  if (credentials == nullptr) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  const std::string& name = server_name.empty() ? verify_as : server_name;
  // Pods are dialled by IP (a headless service resolves to them): the certificate names the service instead.
  if (!name.empty()) args.SetSslTargetNameOverride(name);
  return grpc::CreateCustomChannel(target, credentials, args);
}

}  // namespace dsv4
