// The leader/follower rendezvous over a real gRPC Worker service (in-process, port 0): a group forms and
// all-reduces; mismatched checkpoint, world or rank is refused with FAILED_PRECONDITION naming the mismatch; a
// leader that is not there and a follower that never comes end in clear timeouts; the checkpoint fingerprint.
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/rendezvous.h"
#include "common/grpc_status.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/comm/subprocess.h"

namespace dsv4::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// What worker/service.cc does: the Rendezvous reaction delegates to RendezvousLeader::Handle.
class RendezvousOnlyWorker final : public dsv4::v1::Worker::CallbackService {
 public:
  explicit RendezvousOnlyWorker(RendezvousLeader* leader) : leader_(leader) {}
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* context,
                                       const dsv4::v1::RendezvousRequest* request,
                                       dsv4::v1::RendezvousResponse* response) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(leader_->Handle(*request, response)));
    return reactor;
  }

 private:
  RendezvousLeader* leader_;
};

struct LeaderServer {
  std::unique_ptr<RendezvousLeader> leader;
  std::unique_ptr<RendezvousOnlyWorker> service;
  std::unique_ptr<grpc::Server> server;
  std::string addr;
};

GroupOptions Options(int rank, int world, milliseconds startup = milliseconds(10'000)) {
  GroupOptions o;
  o.rank = rank;
  o.world = world;
  o.checkpoint_fingerprint = "fnv1a64:0123456789abcdef";
  o.comm.startup_timeout = startup;
  o.comm.timeout = milliseconds(10'000);
  o.retry_interval = milliseconds(50);
  return o;
}

LeaderServer StartLeader(const GroupOptions& options) {
  LeaderServer s;
  auto leader = RendezvousLeader::Create(options);
  EXPECT_TRUE(leader.ok()) << leader.status();
  if (!leader.ok()) return s;
  s.leader = std::move(*leader);
  s.service = std::make_unique<RendezvousOnlyWorker>(s.leader.get());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s.service.get());
  s.server = builder.BuildAndStart();
  s.addr = "127.0.0.1:" + std::to_string(port);
  return s;
}

TEST(RendezvousTest, World3FormsAndAllReduces) {
  LeaderServer s = StartLeader(Options(0, 3));
  ASSERT_NE(s.server, nullptr);
  float sums[3] = {0, 0, 0};
  absl::Status status[3];
  auto finish = [&](int rank, absl::StatusOr<Group> group) {
    if (!group.ok()) {
      status[rank] = group.status();
      return;
    }
    float x = static_cast<float>(rank + 1);
    status[rank] = group->data().AllReduceSum(&x, 1);
    sums[rank] = x;
  };
  std::thread leader([&] { finish(0, s.leader->FormGroup()); });
  std::vector<std::thread> followers;
  for (int r = 1; r < 3; ++r) {
    followers.emplace_back([&, r] {
      GroupOptions o = Options(r, 3);
      o.leader_addr = s.addr;
      finish(r, JoinGroup(o));
    });
  }
  leader.join();
  for (auto& t : followers) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(sums[r], 6.0f);
  }
  // Formed: a late (re)joining rank is refused rather than silently accepted.
  dsv4::v1::RendezvousRequest late;
  late.set_rank(1);
  late.set_world(3);
  late.set_checkpoint_fingerprint(Options(0, 3).checkpoint_fingerprint);
  late.set_host("127.0.0.1");
  dsv4::v1::RendezvousResponse resp;
  EXPECT_THAT(std::string(s.leader->Handle(late, &resp).message()), HasSubstr("already formed"));
  s.server->Shutdown();
}

TEST(RendezvousTest, World1NeedsNoPeers) {
  auto leader = RendezvousLeader::Create(Options(0, 1));
  ASSERT_TRUE(leader.ok());
  auto group = (*leader)->FormGroup();
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->data().backend(), "local");
  EXPECT_EQ((*leader)->store_address(), "");
}

// A follower that loaded another checkpoint is refused at once (no retries), and the leader's start-up error
// says who was refused and why.
TEST(RendezvousTest, MismatchedCheckpointIsRefused) {
  LeaderServer s = StartLeader(Options(0, 2, milliseconds(1500)));
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<Group> leader_group = absl::UnknownError("not run");
  std::thread leader([&] { leader_group = s.leader->FormGroup(); });
  GroupOptions o = Options(1, 2);
  o.leader_addr = s.addr;
  o.checkpoint_fingerprint = "fnv1a64:ffffffffffffffff";
  const auto t0 = Clock::now();
  auto follower = JoinGroup(o);
  EXPECT_LT(Clock::now() - t0, milliseconds(1000)) << "a refusal must not be retried";
  ASSERT_EQ(follower.status().code(), absl::StatusCode::kFailedPrecondition) << follower.status();
  EXPECT_THAT(std::string(follower.status().message()), HasSubstr("checkpoint mismatch"));
  EXPECT_THAT(std::string(follower.status().message()), HasSubstr("fnv1a64:ffffffffffffffff"));
  leader.join();
  ASSERT_EQ(leader_group.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(leader_group.status().message()), HasSubstr("rank(s) 1 never completed the rendezvous"));
  EXPECT_THAT(std::string(leader_group.status().message()), HasSubstr("checkpoint mismatch"));
  s.server->Shutdown();
}

TEST(RendezvousTest, MismatchedWorldIsRefused) {
  LeaderServer s = StartLeader(Options(0, 2, milliseconds(500)));
  ASSERT_NE(s.server, nullptr);
  GroupOptions o = Options(1, 4);
  o.leader_addr = s.addr;
  auto follower = JoinGroup(o);
  ASSERT_EQ(follower.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(follower.status().message()),
              HasSubstr("world mismatch: the follower was started with world 4, the leader runs world 2"));
  s.server->Shutdown();
}

TEST(RendezvousTest, HandleChecksRankAndHost) {
  auto leader = RendezvousLeader::Create(Options(0, 3));
  ASSERT_TRUE(leader.ok());
  dsv4::v1::RendezvousRequest req;
  req.set_world(3);
  req.set_checkpoint_fingerprint(Options(0, 3).checkpoint_fingerprint);
  req.set_host("10.0.0.1");
  dsv4::v1::RendezvousResponse resp;
  for (int bad : {0, 3, -1}) {
    req.set_rank(bad);
    const absl::Status st = (*leader)->Handle(req, &resp);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("rank out of range: followers are ranks 1..2"));
  }
  req.set_rank(2);
  ASSERT_TRUE((*leader)->Handle(req, &resp).ok());
  EXPECT_EQ(resp.world(), 3);
  EXPECT_EQ(resp.gloo_store_addr(), (*leader)->store_address());
  EXPECT_TRUE((*leader)->Handle(req, &resp).ok()) << "a retry from the same host is accepted";
  req.set_host("10.0.0.2");
  EXPECT_THAT(std::string((*leader)->Handle(req, &resp).message()), HasSubstr("rank already taken by host 10.0.0.1"));
  req.set_host("");
  req.set_rank(1);
  EXPECT_EQ((*leader)->Handle(req, &resp).code(), absl::StatusCode::kFailedPrecondition);
}

// Nobody listens at the leader's address: the follower retries, then gives up at its start-up deadline.
TEST(RendezvousTest, AbsentLeaderTimesOut) {
  GroupOptions o = Options(1, 2, milliseconds(800));
  o.leader_addr = "127.0.0.1:1";  // a privileged port nobody serves here
  const auto t0 = Clock::now();
  auto follower = JoinGroup(o);
  const auto took = Clock::now() - t0;
  ASSERT_EQ(follower.status().code(), absl::StatusCode::kDeadlineExceeded) << follower.status();
  EXPECT_THAT(std::string(follower.status().message()),
              HasSubstr("rank 1 could not rendezvous with the leader at 127.0.0.1:1 within 800 ms"));
  EXPECT_LT(took, milliseconds(5000));
}

TEST(RendezvousTest, FollowerOptionsAreValidated) {
  GroupOptions o = Options(1, 2);
  EXPECT_EQ(JoinGroup(o).status().code(), absl::StatusCode::kInvalidArgument);  // no leader address
  EXPECT_EQ(RendezvousLeader::Create(Options(1, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousLeader::Create(Options(0, 0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointFingerprintTest, ChangesWithConfigHeadersAndLeadingData) {
  const std::string dir = testing::MakeTempDir("fp");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string st(8, '\0');
  for (int i = 0; i < 8; ++i) st[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  st += header + "DATA";
  write("config.json", R"({"hidden_size": 512})");
  write("model.safetensors", st);
  auto a = CheckpointFingerprint(dir);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ::testing::StartsWith("fnv1a64:"));
  EXPECT_EQ(*CheckpointFingerprint(dir), *a) << "stable";
  // The leading tensor bytes are part of it (a checkpoint of the same shape with other values, e.g. another
  // seed); bytes past the first 4 KiB of data are not read.
  write("model.safetensors", st.substr(0, st.size() - 4) + "ATAD");
  EXPECT_NE(*CheckpointFingerprint(dir), *a);
  write("model.safetensors", st + std::string(4096, 'x'));
  const std::string long_a = *CheckpointFingerprint(dir);
  write("model.safetensors", st + std::string(4092, 'x') + "yyyy");
  EXPECT_EQ(*CheckpointFingerprint(dir), long_a);
  write("model.safetensors", st);
  write("config.json", R"({"hidden_size": 1024})");
  EXPECT_NE(*CheckpointFingerprint(dir), *a);
  std::filesystem::remove(dir + "/config.json");
  EXPECT_EQ(CheckpointFingerprint(dir).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckpointFingerprint(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4::comm
