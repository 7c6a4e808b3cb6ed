// Real dsv4-coordinator and dsv4-worker processes on loopback with TLS, mutual TLS and bearer tokens, using
// certificates made by openssl when the suite starts (docs/security.md):
//   - the coordinator's API over TLS with a token: C++, Python and dsv4-bench clients round-trip; a wrong CA, a
//     plaintext client, a missing or wrong token are refused (UNAVAILABLE / UNAUTHENTICATED); health answers
//     without a token on the API port and on the plaintext probe port; no token ever reaches the log;
//   - the API requiring client certificates; plaintext as the default, said in the log; bad files end start-up;
//   - mutual TLS coordinator -> worker: the worker refuses a coordinator without a client certificate, with a
//     certificate from another CA, or expecting another server name, and serves one with the right certificate;
//   - the tensor-parallel rendezvous (follower -> leader's Worker service) over mutual TLS, and a plaintext
//     follower refused by a TLS leader.
// Binaries come from $DSV4_BINARY_DIR; tests that need dsv4-worker skip with a message when it was not built.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "std_grpc/health.grpc.pb.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/test_client.h"
#include "tests/security/security_test_util.h"
#include "tests/worker/process_util.h"

namespace dsv4::testing {
namespace {

using ::dsv4::worker::testing::BinaryPath;
using ::dsv4::worker::testing::ChildProcess;
using ::dsv4::worker::testing::FreePort;
using ::dsv4::worker::testing::HttpGet;
using ::dsv4::worker::testing::ReadFile;
using ::dsv4::worker::testing::RunAndCapture;
using ::dsv4::worker::testing::SourcePath;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "tok-a1b2c3d4e5f6a7b8c9d0";
constexpr char kWrongToken[] = "tok-ffffffffffffffffffff";

// grpc.health.v1 Check of the whole server: 1 SERVING, 2 NOT_SERVING, -1 the call failed.
int Health(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, {}, &resp).ok() ? resp.status() : -1;
}

grpc::Status ModelInfo(const std::shared_ptr<grpc::Channel>& channel, dsv4::v1::GetModelInfoResponse* info = nullptr) {
  auto stub = dsv4::v1::Coordinator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  dsv4::v1::GetModelInfoResponse unused;
  return stub->GetModelInfo(&ctx, {}, info != nullptr ? info : &unused);
}

// True once the coordinator reports `n` ready groups; false after `timeout`.
bool WaitReadyGroups(const std::shared_ptr<grpc::Channel>& channel, int n, absl::Duration timeout) {
  for (const absl::Time end = absl::Now() + timeout; absl::Now() < end; absl::SleepFor(absl::Milliseconds(50))) {
    dsv4::v1::GetModelInfoResponse info;
    if (ModelInfo(channel, &info).ok() && info.ready_groups() >= n) return true;
  }
  return false;
}

double MetricValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

class SecureProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/security_" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
    pki_ = new TestPki{*dir_ + "/pki"};
    ASSERT_TRUE(MakeTestPki(pki_->dir).ok());
    std::ofstream(*dir_ + "/tokens") << "# API tokens\n" << kToken << "\nanother-token-0000000000\n";
    std::ofstream(*dir_ + "/client.token") << kToken << "\n";
    std::ofstream(*dir_ + "/wrong.token") << kWrongToken << "\n";
  }
  static void TearDownTestSuite() {
    // Kept when something failed: the processes' logs are there.
    if (::testing::UnitTest::GetInstance()->failed_test_count() == 0) std::filesystem::remove_all(*dir_);
    delete pki_;
    delete dir_;
  }

  // Starts dsv4-coordinator with `flags` (plus loopback listen/metrics and a ready file) and waits for its ready
  // file, written once it serves (with no group ready yet: --min-ready-groups=0); the map has grpc=, metrics=
  // and, with --health-listen, health=.
  std::map<std::string, std::string> StartCoordinator(const std::string& name, const std::vector<std::string>& flags,
                                                      std::optional<ChildProcess>* child) {
    const std::string ready = *dir_ + "/" + name + ".ready";
    std::vector<std::string> argv = {BinaryPath("coordinator/dsv4-coordinator"), "--listen=127.0.0.1:0",
                                     "--metrics-listen=127.0.0.1:0", "--ready-file=" + ready,
                                     "--poll-interval-ms=50", "--drain-timeout=5", "--min-ready-groups=0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<ChildProcess> c = ChildProcess::Start(argv, Log(name));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    child->emplace(std::move(*c));
    auto out = WaitReadyFile(**child, ready, absl::Seconds(30));
    EXPECT_FALSE(out.empty()) << name << " did not start:\n" << ReadFile(Log(name));
    return out;
  }

  static std::string Log(const std::string& name) { return *dir_ + "/" + name + ".log"; }

  static std::string* dir_;
  static TestPki* pki_;
};
std::string* SecureProcessTest::dir_ = nullptr;
TestPki* SecureProcessTest::pki_ = nullptr;

// ------------------------------------------------------------------------------ coordinator API (fake groups)

TEST_F(SecureProcessTest, CoordinatorTlsAndBearerTokens) {
  FakeWorker group({.step = absl::Milliseconds(2)});
  std::optional<ChildProcess> coord;
  auto ready = StartCoordinator("coord_tls",
                                {"--workers=" + group.address(), "--tls-cert=" + pki_->Cert("coordinator"),
                                 "--tls-key=" + pki_->Key("coordinator"), "--auth-token-file=" + *dir_ + "/tokens",
                                 "--health-listen=127.0.0.1:0"},
                                &coord);
  const std::string target = ready["grpc"];
  ASSERT_FALSE(target.empty());
  ASSERT_FALSE(ready["health"].empty()) << "ready file without health=";

  // TLS round trip with a token: the stream equals the fake's generation.
  auto good = Channel(target, pki_->Ca(), "", "", kToken);
  ASSERT_TRUE(WaitReadyGroups(good, 1, absl::Seconds(20))) << ReadFile(Log("coord_tls"));
  auto stub = dsv4::v1::Coordinator::NewStub(good);
  const StreamResult r = RunGenerate(*stub, MakeRequest({1, 2, 3}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGeneration({1, 2, 3}, 10, false, 0, 1000));

  // No token, a wrong token: UNAUTHENTICATED on both methods, and the group never sees the request.
  const int calls_before = group.generate_calls();
  for (const char* token : {"", kWrongToken}) {
    SCOPED_TRACE(absl::StrCat("token '", token, "'"));
    auto channel = Channel(target, pki_->Ca(), "", "", token);
    const grpc::Status info = ModelInfo(channel);
    EXPECT_EQ(info.error_code(), grpc::StatusCode::UNAUTHENTICATED) << info.error_message();
    auto s = dsv4::v1::Coordinator::NewStub(channel);
    const StreamResult refused = RunGenerate(*s, MakeRequest({1, 2, 3}, 10));
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.status.error_message();
    EXPECT_TRUE(refused.tokens.empty());
    EXPECT_THAT(refused.status.error_message(), Not(HasSubstr(kWrongToken)));
    // Health stays reachable without a token (probes carry none).
    EXPECT_EQ(Health(channel), 1);
  }
  EXPECT_EQ(group.generate_calls(), calls_before);

  // The wrong CA, or no TLS at all: the connection itself fails.
  auto wrong_ca = Channel(target, pki_->Ca("other"), "", "", kToken);
  EXPECT_EQ(ModelInfo(wrong_ca).error_code(), grpc::StatusCode::UNAVAILABLE);
  auto plaintext = Channel(target, "");
  EXPECT_EQ(ModelInfo(plaintext).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Health(plaintext), -1);
  {
    auto s = dsv4::v1::Coordinator::NewStub(plaintext);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    EXPECT_EQ(RunGenerate(*s, MakeRequest({1, 2}, 2), -1, &ctx).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  }

  // The probe port: plaintext health only, mirroring the API port; the API is not there.
  auto probe = Channel(ready["health"], "");
  EXPECT_EQ(Health(probe), 1);
  EXPECT_EQ(ModelInfo(probe).error_code(), grpc::StatusCode::UNIMPLEMENTED);

  // Another language: Python's grpcio over TLS with access-token credentials (and refused without them).
  const std::string py_log = *dir_ + "/python_tls.log";
  const std::string want = absl::StrJoin(FakeGeneration({1, 2, 3, 4, 5}, 12, false, 0, 1000), " ");
  const std::string cmd =
      absl::StrCat("/usr/bin/python3 ", SourcePath("tests/coordinator/python_client.py"), " --target ", target,
                   " --source-dir ", SourcePath(""), " --tls-ca ", pki_->Ca(), " --token-file ", *dir_,
                   "/client.token --expect-tokens '", want, "' > ", py_log, " 2>&1");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(py_log);
  EXPECT_THAT(ReadFile(py_log), HasSubstr("Generate without a token: UNAUTHENTICATED"));

  // dsv4-bench with --tls-ca and --token-file; and refused with the wrong token.
  const std::vector<std::string> bench = {BinaryPath("bench/serving/dsv4-bench"), "--target=" + target,
                                          "--tls-ca=" + pki_->Ca(), "--num-prompts=4", "--random-input-len=8",
                                          "--random-output-len=4", "--concurrency=2"};
  std::vector<std::string> with_token = bench;
  with_token.push_back("--token-file=" + *dir_ + "/client.token");
  absl::StatusOr<std::string> out = RunAndCapture(with_token, 60);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("concurrency=2: 4 ok, 0 failed"));
  std::vector<std::string> wrong_token = bench;
  wrong_token.push_back("--token-file=" + *dir_ + "/wrong.token");
  EXPECT_FALSE(RunAndCapture(wrong_token, 60).ok());

  // Refusals are counted; no token, right or wrong, is ever logged.
  absl::StatusOr<std::string> scrape = HttpGet(ready["metrics"], "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_GE(MetricValue(*scrape, "dsv4_coordinator_unauthenticated_total{"), 6) << *scrape;
  coord->Signal(SIGTERM);
  absl::StatusOr<int> code = coord->Wait(20);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  const std::string log = ReadFile(Log("coord_tls"));
  EXPECT_THAT(log, HasSubstr("coordinator API (dsv4.v1.Coordinator): TLS (certificate"));
  EXPECT_THAT(log, HasSubstr("bearer tokens required on Generate and GetModelInfo (2 tokens"));
  EXPECT_THAT(log, Not(HasSubstr(kToken)));
  EXPECT_THAT(log, Not(HasSubstr(kWrongToken)));
}

TEST_F(SecureProcessTest, CoordinatorApiCanRequireClientCertificates) {
  FakeWorker group({.step = absl::Milliseconds(2)});
  std::optional<ChildProcess> coord;
  auto ready = StartCoordinator("coord_mtls",
                                {"--workers=" + group.address(), "--tls-cert=" + pki_->Cert("coordinator"),
                                 "--tls-key=" + pki_->Key("coordinator"), "--tls-client-ca=" + pki_->Ca()},
                                &coord);
  const std::string target = ready["grpc"];
  ASSERT_FALSE(target.empty());
  auto with_cert = Channel(target, pki_->Ca(), pki_->Cert("client"), pki_->Key("client"));
  ASSERT_TRUE(WaitReadyGroups(with_cert, 1, absl::Seconds(20)));
  EXPECT_EQ(ModelInfo(Channel(target, pki_->Ca())).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ModelInfo(Channel(target, pki_->Ca(), pki_->Cert("rogue", "other"), pki_->Key("rogue", "other")))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(ReadFile(Log("coord_mtls")), HasSubstr("mutual TLS: client certificates required"));
}

TEST_F(SecureProcessTest, PlaintextIsTheDefaultAndSaysSo) {
  FakeWorker group({.step = absl::Milliseconds(2)});
  std::optional<ChildProcess> coord;
  auto ready = StartCoordinator("coord_plain", {"--workers=" + group.address()}, &coord);
  ASSERT_FALSE(ready["grpc"].empty());
  auto plaintext = Channel(ready["grpc"], "");
  ASSERT_TRUE(WaitReadyGroups(plaintext, 1, absl::Seconds(20)));
  EXPECT_EQ(ready.count("health"), 0u);
  const std::string log = ReadFile(Log("coord_plain"));
  EXPECT_THAT(log, HasSubstr("coordinator API (dsv4.v1.Coordinator): PLAINTEXT"));
  EXPECT_THAT(log, HasSubstr("coordinator -> workers: PLAINTEXT"));
  EXPECT_THAT(log, HasSubstr("coordinator API: no authentication"));
}

TEST_F(SecureProcessTest, BadSecurityFilesEndStartUpWithOneClearLine) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--tls-cert=" + pki_->Cert("coordinator"), "--tls-key=" + pki_->Key("worker")},
       "--tls-key " + pki_->Key("worker") + " is not the key of the certificate"},
      {{"--auth-token-file=" + *dir_ + "/no-such-file"}, "--auth-token-file " + *dir_ + "/no-such-file"},
      {{"--worker-tls-ca=" + pki_->Key("worker")}, "--worker-tls-ca " + pki_->Key("worker") + ": no PEM"},
  };
  int i = 0;
  for (const auto& [flags, want] : cases) {
    const std::string log = *dir_ + "/bad_flags" + std::to_string(i++) + ".log";
    std::vector<std::string> argv = {BinaryPath("coordinator/dsv4-coordinator"), "--listen=127.0.0.1:0",
                                     "--workers=127.0.0.1:1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<ChildProcess> c = ChildProcess::Start(argv, log);
    ASSERT_TRUE(c.ok());
    absl::StatusOr<int> code = c->Wait(20);
    ASSERT_TRUE(code.ok()) << want;
    EXPECT_NE(*code, 0) << want;
    EXPECT_THAT(ReadFile(log), HasSubstr(want));
  }
}

// ----------------------------------------------------------------------------- real workers, mutual TLS

class SecureWorkerTest : public SecureProcessTest {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(BinaryPath("worker/dsv4-worker")) ||
        !std::filesystem::exists(BinaryPath("tools/make_checkpoint/dsv4-make-checkpoint"))) {
      GTEST_SKIP() << "dsv4-worker or dsv4-make-checkpoint is not built in " << BinaryPath("");
    }
    if (!std::filesystem::exists(Checkpoint())) {
      absl::StatusOr<std::string> made =
          RunAndCapture({BinaryPath("tools/make_checkpoint/dsv4-make-checkpoint"), "--config",
                         SourcePath("configs/tiny.json"), "--seed", "1", "--out", Checkpoint()},
                        120);
      ASSERT_TRUE(made.ok()) << made.status();
    }
  }

  static std::string Checkpoint() { return *dir_ + "/ckpt"; }

  // dsv4-worker flags for the tiny checkpoint, TLS with the cluster's worker certificate, requiring clients'.
  std::vector<std::string> WorkerFlags(int world, int rank) const {
    return {BinaryPath("worker/dsv4-worker"), "--checkpoint=" + Checkpoint(), "--max-batch=4",
            "--max-context=1024", "--kv-pages=64", "--prefill-chunk=128", "--threads=1",
            absl::StrCat("--world=", world), absl::StrCat("--rank=", rank), "--tls-cert=" + pki_->Cert("worker"),
            "--tls-key=" + pki_->Key("worker"), "--tls-client-ca=" + pki_->Ca()};
  }

  static grpc::Status WorkerGenerate(const std::shared_ptr<grpc::Channel>& channel, int max_new,
                                     std::vector<int32_t>* tokens) {
    auto stub = dsv4::v1::Worker::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    dsv4::v1::GenerateRequest req = MakeRequest({0, 17, 99, 1234, 7}, max_new);
    req.mutable_sampling()->set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, req);
    dsv4::v1::GenerateResponse msg;
    while (reader->Read(&msg)) tokens->insert(tokens->end(), msg.token_ids().begin(), msg.token_ids().end());
    return reader->Finish();
  }
};

TEST_F(SecureWorkerTest, MutualTlsFromCoordinatorToWorker) {
  const std::string ready_path = *dir_ + "/worker_mtls.ready";
  std::vector<std::string> argv = WorkerFlags(1, 0);
  argv.insert(argv.end(), {"--listen=127.0.0.1:0", "--health-listen=127.0.0.1:0", "--ready-file=" + ready_path});
  absl::StatusOr<ChildProcess> worker = ChildProcess::Start(argv, Log("worker_mtls"));
  ASSERT_TRUE(worker.ok());
  auto ready = WaitReadyFile(*worker, ready_path, absl::Seconds(120));
  const std::string address = ready["grpc"];
  ASSERT_FALSE(address.empty()) << ReadFile(Log("worker_mtls"));
  EXPECT_THAT(ReadFile(Log("worker_mtls")), HasSubstr("mutual TLS: client certificates required"));

  // Directly: only a client with a certificate from the cluster's CA gets an answer.
  EXPECT_EQ(Health(Channel(ready["health"], "")), 1);
  EXPECT_EQ(Health(Channel(address, "")), -1);                                          // plaintext
  EXPECT_EQ(Health(Channel(address, pki_->Ca())), -1);                                  // no client certificate
  EXPECT_EQ(Health(Channel(address, pki_->Ca(), pki_->Cert("rogue", "other"), pki_->Key("rogue", "other"))), -1);
  std::vector<int32_t> direct;
  const grpc::Status s =
      WorkerGenerate(Channel(address, pki_->Ca(), pki_->Cert("coordinator"), pki_->Key("coordinator")), 6, &direct);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(direct.size(), 6u);

  // Four coordinators at once: only the one with the right CA, certificate and server name gets the group.
  const std::string cert = "--worker-tls-cert=" + pki_->Cert("coordinator");
  const std::string key = "--worker-tls-key=" + pki_->Key("coordinator");
  const std::string ca = "--worker-tls-ca=" + pki_->Ca();
  const std::string workers = "--workers=" + address;
  std::optional<ChildProcess> good, no_cert, rogue, wrong_name;
  auto good_ready = StartCoordinator("coord_to_worker", {workers, ca, cert, key}, &good);
  auto no_cert_ready = StartCoordinator("coord_no_cert", {workers, ca}, &no_cert);
  auto rogue_ready = StartCoordinator("coord_rogue",
                                      {workers, "--worker-tls-ca=" + pki_->Ca("other"),
                                       "--worker-tls-cert=" + pki_->Cert("rogue", "other"),
                                       "--worker-tls-key=" + pki_->Key("rogue", "other")},
                                      &rogue);
  auto wrong_name_ready =
      StartCoordinator("coord_wrong_name", {workers, ca, cert, key, "--worker-tls-server-name=elsewhere.example"},
                       &wrong_name);
  auto good_channel = Channel(good_ready["grpc"], "");
  ASSERT_TRUE(WaitReadyGroups(good_channel, 1, absl::Seconds(20))) << ReadFile(Log("coord_to_worker"));
  auto stub = dsv4::v1::Coordinator::NewStub(good_channel);
  dsv4::v1::GenerateRequest req = MakeRequest({0, 17, 99, 1234, 7}, 6);
  req.mutable_sampling()->set_ignore_eos(true);
  const StreamResult via = RunGenerate(*stub, req);
  ASSERT_TRUE(via.status.ok()) << via.status.error_message();
  EXPECT_EQ(via.tokens, direct);
  EXPECT_THAT(ReadFile(Log("coord_to_worker")), HasSubstr("coordinator -> workers: TLS (server verified against"));
  // The good coordinator was ready within a few polls; give the others ample time more (polls every 50 ms).
  absl::SleepFor(absl::Seconds(2));
  for (const auto* r : {&no_cert_ready, &rogue_ready, &wrong_name_ready}) {
    dsv4::v1::GetModelInfoResponse info;
    const grpc::Status st = ModelInfo(Channel(r->at("grpc"), ""), &info);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << r->at("grpc") << " reached the worker";
  }
}

TEST_F(SecureWorkerTest, TensorParallelRendezvousOverMutualTls) {
  const std::string leader_addr = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::string> follower_argv = WorkerFlags(2, 1);
  follower_argv.insert(follower_argv.end(), {"--listen=127.0.0.1:0", "--leader=" + leader_addr,
                                             "--leader-tls-ca=" + pki_->Ca(), "--startup-timeout=60"});
  absl::StatusOr<ChildProcess> follower = ChildProcess::Start(follower_argv, Log("tp_follower"));
  ASSERT_TRUE(follower.ok());
  const std::string ready_path = *dir_ + "/tp_leader.ready";
  std::vector<std::string> leader_argv = WorkerFlags(2, 0);
  leader_argv.insert(leader_argv.end(),
                     {"--listen=" + leader_addr, "--startup-timeout=60", "--ready-file=" + ready_path});
  absl::StatusOr<ChildProcess> leader = ChildProcess::Start(leader_argv, Log("tp_leader"));
  ASSERT_TRUE(leader.ok());
  auto ready = WaitReadyFile(*leader, ready_path, absl::Seconds(120));
  ASSERT_FALSE(ready["grpc"].empty()) << ReadFile(Log("tp_leader")) << "\nfollower:\n" << ReadFile(Log("tp_follower"));
  EXPECT_THAT(ReadFile(Log("tp_follower")), HasSubstr("this rank -> its leader: TLS (server verified against"));
  std::vector<int32_t> tokens;
  const grpc::Status s =
      WorkerGenerate(Channel(ready["grpc"], pki_->Ca(), pki_->Cert("coordinator"), pki_->Key("coordinator")), 4,
                     &tokens);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens.size(), 4u);
}

TEST_F(SecureWorkerTest, PlaintextFollowerIsRefusedByTlsLeader) {
  const std::string leader_addr = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::string> leader_argv = WorkerFlags(2, 0);
  leader_argv.insert(leader_argv.end(), {"--listen=" + leader_addr, "--startup-timeout=4"});
  absl::StatusOr<ChildProcess> leader = ChildProcess::Start(leader_argv, Log("tp_tls_leader"));
  ASSERT_TRUE(leader.ok());
  // No --leader-tls-ca: the follower dials in plaintext and never gets an answer.
  std::vector<std::string> follower_argv = {BinaryPath("worker/dsv4-worker"), "--checkpoint=" + Checkpoint(),
                                            "--threads=1", "--world=2", "--rank=1", "--listen=127.0.0.1:0",
                                            "--leader=" + leader_addr, "--startup-timeout=4"};
  absl::StatusOr<ChildProcess> follower = ChildProcess::Start(follower_argv, Log("tp_plain_follower"));
  ASSERT_TRUE(follower.ok());
  absl::StatusOr<int> fcode = follower->Wait(30);
  ASSERT_TRUE(fcode.ok()) << "follower still running";
  EXPECT_NE(*fcode, 0);
  EXPECT_THAT(ReadFile(Log("tp_plain_follower")), HasSubstr("could not rendezvous with the leader"));
  absl::StatusOr<int> lcode = leader->Wait(30);
  ASSERT_TRUE(lcode.ok()) << "leader still running";
  EXPECT_NE(*lcode, 0);
  EXPECT_THAT(ReadFile(Log("tp_tls_leader")), HasSubstr("never completed the rendezvous"));
}

}  // namespace
}  // namespace dsv4::testing
