// Unit tests of common/tls_options (credentials from PEM files: every bad file named at start-up) and
// common/bearer_tokens (the token file and the metadata check), with certificates made by openssl at test time.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/bearer_tokens.h"
#include "common/tls_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/security/security_test_util.h"

namespace dsv4::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class TlsOptionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki{::testing::TempDir() + "/tls_unit_" + std::to_string(getpid())};
    ASSERT_TRUE(MakeTestPki(pki_->dir).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(pki_->dir);
    delete pki_;
    pki_ = nullptr;
  }
  static std::string Write(const std::string& name, const std::string& text) {
    const std::string path = pki_->dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  static TestPki* pki_;
};
TestPki* TlsOptionsTest::pki_ = nullptr;

TEST_F(TlsOptionsTest, EmptyOptionsArePlaintext) {
  EXPECT_FALSE(ServerTlsOptions{}.enabled());
  EXPECT_FALSE(ClientTlsOptions{}.enabled());
  absl::StatusOr<ChannelSecurity> c = MakeChannelSecurity({}, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tls());
  EXPECT_TRUE(MakeServerCredentials({}, "test").ok());
}

TEST_F(TlsOptionsTest, GoodFilesMakeCredentials) {
  const ServerTlsOptions server{.cert_file = pki_->Cert("worker"), .key_file = pki_->Key("worker"),
                                .client_ca_file = pki_->Ca()};
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> s = MakeServerCredentials(server, "test");
  ASSERT_TRUE(s.ok()) << s.status();
  ClientTlsOptions client;
  client.ca_file = pki_->Ca();
  client.cert_file = pki_->Cert("coordinator");
  client.key_file = pki_->Key("coordinator");
  absl::StatusOr<ChannelSecurity> c = MakeChannelSecurity(client, "test", "a-token-of-sixteen+");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tls());
}

TEST_F(TlsOptionsTest, BadFilesAreNamedWithTheirFlag) {
  const std::string not_pem = Write("not.pem", "hello\n");
  struct Case {
    ServerTlsOptions options;
    std::string want;
  };
  const Case cases[] = {
      {{.cert_file = pki_->Cert("worker")}, "TLS needs both --tls-cert and --tls-key"},
      {{.client_ca_file = pki_->Ca()}, "TLS needs both --tls-cert and --tls-key (--tls-client-ca is set)"},
      {{.cert_file = pki_->dir + "/missing.crt", .key_file = pki_->Key("worker")},
       "--tls-cert " + pki_->dir + "/missing.crt: cannot open the file"},
      {{.cert_file = not_pem, .key_file = pki_->Key("worker")}, "--tls-cert " + not_pem + ": no PEM certificate"},
      {{.cert_file = pki_->Cert("worker"), .key_file = not_pem}, "--tls-key " + not_pem + ": no unencrypted PEM"},
      {{.cert_file = pki_->Cert("worker"), .key_file = pki_->Key("coordinator")},
       "--tls-key " + pki_->Key("coordinator") + " is not the key of the certificate in --tls-cert"},
      {{.cert_file = pki_->Cert("worker"), .key_file = pki_->Key("worker"), .client_ca_file = not_pem},
       "--tls-client-ca " + not_pem + ": no PEM certificate"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> s = MakeServerCredentials(c.options, "test");
    ASSERT_FALSE(s.ok()) << c.want;
    EXPECT_EQ(s.status().code(), c.options.cert_file.find("missing") != std::string::npos
                                     ? absl::StatusCode::kNotFound
                                     : absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.want));
  }
}

TEST_F(TlsOptionsTest, ClientErrorsUseTheCallersFlagNames) {
  ClientTlsOptions o;
  o.flag_prefix = "--worker-tls-";
  o.ca_file = pki_->Ca();
  o.cert_file = pki_->Cert("coordinator");
  absl::StatusOr<ChannelSecurity> c = MakeChannelSecurity(o, "");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("--worker-tls-key is required with --worker-tls-cert"));
  o.key_file = pki_->Key("worker");
  c = MakeChannelSecurity(o, "");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("--worker-tls-key " + pki_->Key("worker") + " is not"));
  // A token would cross the network readable: refused without TLS.
  c = MakeChannelSecurity({}, "", "a-token-of-sixteen+");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("a bearer token is sent only over TLS"));
}

// ---------------------------------------------------------------------------------------------------- tokens

constexpr char kToken[] = "s3cr3t-token-0123456789";

std::multimap<grpc::string_ref, grpc::string_ref> Metadata(const std::vector<std::string>& authorization) {
  std::multimap<grpc::string_ref, grpc::string_ref> m;
  m.emplace("user-agent", "test");
  for (const std::string& a : authorization) m.emplace("authorization", a);
  return m;
}

TEST(BearerTokensTest, FileFormat) {
  absl::StatusOr<BearerTokens> t =
      BearerTokens::Parse(absl::StrCat("# comment\n\n  ", kToken, "  \nsecond-token-abcdefghij\r\n"), "f");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);

  const std::pair<std::string, std::string> bad[] = {
      {"", "f: no token in the file"},
      {"# only a comment\n", "f: no token in the file"},
      {"short\n", "f: line 1: a token has at least 16 characters"},
      {"# c\ntoken with spaces inside\n", "f: line 2: a token has only printable characters"},
  };
  for (const auto& [text, want] : bad) {
    absl::StatusOr<BearerTokens> b = BearerTokens::Parse(text, "f");
    ASSERT_FALSE(b.ok()) << want;
    EXPECT_THAT(std::string(b.status().message()), HasSubstr(want));
  }
  // Errors name the line, never its text.
  absl::StatusOr<BearerTokens> b = BearerTokens::Parse("secret-but-short\tx\n", "f");
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()), Not(HasSubstr("secret")));

  absl::StatusOr<BearerTokens> missing = BearerTokens::Load("--auth-token-file", "/nonexistent/tokens");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--auth-token-file /nonexistent/tokens"));
}

TEST(BearerTokensTest, CheckAcceptsOnlyOneKnownBearerToken) {
  absl::StatusOr<BearerTokens> t = BearerTokens::Parse(absl::StrCat(kToken, "\nsecond-token-abcdefghij\n"), "f");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->Check(Metadata({absl::StrCat("Bearer ", kToken)})).ok());
  EXPECT_TRUE(t->Check(Metadata({"bearer second-token-abcdefghij"})).ok());  // the scheme is case-insensitive

  const std::pair<std::vector<std::string>, std::string> refused[] = {
      {{}, "missing request metadata 'authorization: Bearer <token>'"},
      {{kToken}, "is not 'Bearer <token>'"},
      {{absl::StrCat("Basic ", kToken)}, "is not 'Bearer <token>'"},
      {{"Bearer wrong-token-0123456789"}, "the bearer token is not valid"},
      {{absl::StrCat("Bearer ", kToken, "x")}, "the bearer token is not valid"},
      {{absl::StrCat("Bearer ", kToken), "Bearer x"}, "more than one 'authorization'"},
  };
  for (const auto& [values, want] : refused) {
    const grpc::Status s = t->Check(Metadata(values));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << want;
    EXPECT_THAT(s.error_message(), HasSubstr(want));
    EXPECT_THAT(s.error_message(), Not(HasSubstr(kToken)));
  }
}

}  // namespace
}  // namespace dsv4::testing
