// The real dsv4-worker process against what a hostile client or a careless operator does (issue 16): a second
// worker started on ports already in use, --help, request bytes that do not decode on every method, and the
// prompt-token counter after a failover resume. Tiny checkpoint made per test; loopback only.
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/raw_grpc.h"
#include "tests/worker/process_util.h"

namespace dsv4::worker::testing {
namespace {

using dsv4::testing::GenerateRequestWithBadUtf8;
using dsv4::testing::RawUnaryCall;

class WorkerHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(DSV4_WORKER_HAVE_MODEL)
    GTEST_SKIP() << "dsv4_model is not part of this build: no dsv4-worker to test";
#endif
    std::string templ = ::testing::TempDir() + "/worker_hostile_XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    checkpoint_ = dir_ + "/tiny";
    const absl::Status made = MakeTinyCheckpoint(checkpoint_, 1);
    ASSERT_TRUE(made.ok()) << made;
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  // A worker with /metrics on port 0; *address and *metrics get where it listens.
  absl::StatusOr<ChildProcess> Start(std::string* address, std::string* metrics) {
    return StartWorker(dir_, {"--checkpoint=" + checkpoint_, "--listen=127.0.0.1:0", "--max-context=512",
                              "--threads=1", "--kv-pages=64", "--metrics-listen=127.0.0.1:0"},
                       address, nullptr, metrics);
  }

  std::string dir_, checkpoint_;
};

// Issue 16 #3.
TEST_F(WorkerHostileTest, HelpListsItsFlagsWithDefaultsAndExitsZero) {
  for (const char* flag : {"--help", "-h"}) {
    auto out = RunAndCapture({BinaryPath("worker/dsv4-worker"), flag}, 30);  // an error unless it exits 0
    ASSERT_TRUE(out.ok()) << flag << ": " << out.status();
    EXPECT_FALSE(absl::StrContains(*out, "No flags matched")) << *out;
    for (const char* want : {"--checkpoint (default \"\")", "--listen (default \"127.0.0.1:0\")",
                             "--max-batch (default 32)", "--max-waiting (default 256)", "--kv-pages (default 0)",
                             "--mem-fraction (default 0.3)", "--metrics-listen (default \"\")",
                             "--phase-timing-every (default 64)"}) {
      EXPECT_TRUE(absl::StrContains(*out, want)) << flag << " lacks " << want << ":\n" << *out;
    }
  }
}

// Issue 16 #1: gRPC would share the port (SO_REUSEPORT) and the newcomer would take part of the traffic.
TEST_F(WorkerHostileTest, SecondWorkerOnPortsInUseExitsNamingThePort) {
  std::string address, metrics;
  auto first = Start(&address, &metrics);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string port = address.substr(address.rfind(':') + 1);
  const std::string metrics_port = metrics.substr(metrics.rfind(':') + 1);
  struct Case {
    std::vector<std::string> flags;
    std::string expect;
  };
  int n = 0;
  for (const Case& c : {Case{{"--listen=" + address}, "--listen " + address + ": cannot listen on port " + port},
                        Case{{"--listen=127.0.0.1:0", "--metrics-listen=" + metrics},
                             "--metrics-listen " + metrics + ": cannot listen on port " + metrics_port}}) {
    std::vector<std::string> argv = {BinaryPath("worker/dsv4-worker"), "--checkpoint=" + checkpoint_,
                                     "--threads=1", "--kv-pages=64", "--max-context=512",
                                     absl::StrCat("--ready-file=", dir_, "/second", n, ".ready")};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const std::string log = absl::StrCat(dir_, "/second", n++, ".log");
    auto second = ChildProcess::Start(argv, log);
    ASSERT_TRUE(second.ok()) << second.status();
    auto code = second->Wait(60);
    ASSERT_TRUE(code.ok()) << "a second worker kept running with " << c.flags.back() << ":\n" << ReadFile(log);
    EXPECT_NE(*code, 0);
    EXPECT_TRUE(absl::StrContains(ReadFile(log), c.expect)) << ReadFile(log);
  }
  EXPECT_EQ(HealthStatus(address), 1);  // the first one still owns its ports and serves
  auto text = HttpGet(metrics, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(absl::StrContains(*text, "dsv4_generation_tokens_total"));
}

// Issue 16 #2: every Worker method answers bytes that do not decode with INVALID_ARGUMENT naming the message
// (gRPC's typed handlers answered UNIMPLEMENTED with an empty message), and the worker keeps serving.
TEST_F(WorkerHostileTest, UndecodableRequestsAreInvalidArgumentOnEveryMethod) {
  std::string address, metrics;
  auto w = Start(&address, &metrics);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string garbage("\xff\xff\xff\xff\x0f", 5);
  struct Case {
    std::string method, bytes, type;
  };
  for (const Case& c : {Case{"Generate", GenerateRequestWithBadUtf8(), "dsv4.v1.GenerateRequest"},
                        Case{"Generate", garbage, "dsv4.v1.GenerateRequest"},
                        Case{"GetLoad", garbage, "dsv4.v1.GetLoadRequest"},
                        Case{"Drain", garbage, "dsv4.v1.DrainRequest"},
                        Case{"Rendezvous", garbage, "dsv4.v1.RendezvousRequest"},
                        Case{"GetModelInfo", garbage, "dsv4.v1.GetModelInfoRequest"}}) {
    const grpc::Status st = RawUnaryCall(address, "/dsv4.v1.Worker/" + c.method, c.bytes);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.method << ": " << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), "could not be parsed as " + c.type)) << st.error_message();
  }
  EXPECT_TRUE(absl::StrContains(
      RawUnaryCall(address, "/dsv4.v1.Worker/Generate", GenerateRequestWithBadUtf8()).error_message(),
      "request_id"));
  auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  dsv4::v1::GetLoadResponse load;
  ASSERT_TRUE(stub->GetLoad(&ctx, {}, &load).ok());
  EXPECT_FALSE(load.draining());  // the garbage Drain did not drain
  EXPECT_EQ(HealthStatus(address), 1);
}

// Issue 16 #5: after a failover the surviving worker prefills the original prompt plus the resumed tokens, and
// dsv4_prompt_tokens_total counts all of them.
TEST_F(WorkerHostileTest, PromptTokensIncludeTheResumedTokens) {
  std::string address, metrics;
  auto w = Start(&address, &metrics);
  ASSERT_TRUE(w.ok()) << w.status();
  auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  dsv4::v1::GenerateRequest r;
  for (int32_t t : {5, 6, 7, 8, 40, 41, 42}) r.add_prompt_token_ids(t);  // 4 prompt + 3 resumed
  r.set_resume_generated(3);
  r.mutable_sampling()->set_max_new_tokens(6);
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, r);
  dsv4::v1::GenerateResponse msg, last;
  int tokens = 0;
  while (reader->Read(&msg)) {
    tokens += msg.token_ids_size();
    last = msg;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 3);
  EXPECT_EQ(last.usage().prompt_tokens(), 4);  // Usage keeps the client's view
  auto text = HttpGet(metrics, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(absl::StrContains(*text, "dsv4_prompt_tokens_total{group=\"0\",rank=\"0\",role=\"worker\"} 7"))
      << *text;
  EXPECT_TRUE(absl::StrContains(*text, "dsv4_generation_tokens_total{group=\"0\",rank=\"0\",role=\"worker\"} 3"));
}

}  // namespace
}  // namespace dsv4::worker::testing
