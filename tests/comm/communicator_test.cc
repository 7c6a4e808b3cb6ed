// In-process tests of the communicator pieces: LocalCommunicator, BroadcastBytes, the TCP rendezvous store and
// argument validation. Multi-process behaviour is in gloo_process_test.cc.
#include <chrono>
#include <random>
#include <thread>

#include "comm/communicator.h"
#include "comm/gloo_communicator.h"
#include "comm/tcp_store.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dsv4::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(LocalCommunicatorTest, CollectivesAreTheIdentity) {
  LocalCommunicator comm;
  EXPECT_EQ(comm.world(), 1);
  std::mt19937 rng(std::random_device{}());
  std::vector<float> v(257);
  for (auto& x : v) x = std::uniform_real_distribution<float>(-3, 3)(rng);
  const auto before = v;
  ASSERT_TRUE(comm.AllReduceSum(v.data(), v.size()).ok());
  EXPECT_EQ(v, before);
  std::vector<uint8_t> send(33), recv(33);
  for (auto& b : send) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(comm.AllGather(send.data(), recv.data(), send.size()).ok());
  EXPECT_EQ(recv, send);
  EXPECT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(comm.Broadcast(v.data(), 4, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.AllReduceSum(nullptr, 3).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BroadcastBytesTest, RoundTripsAndRefusesOversizedMessages) {
  LocalCommunicator comm;
  std::string msg = "plan bytes";
  ASSERT_TRUE(BroadcastBytes(comm, &msg, 0).ok());
  EXPECT_EQ(msg, "plan bytes");
  std::string big(100, 'x');
  const absl::Status s = BroadcastBytes(comm, &big, 0, /*max_bytes=*/10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("100 bytes"));
  EXPECT_EQ(BroadcastBytes(comm, &msg, 3).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateRankWorldTest, NamesTheBadValue) {
  EXPECT_TRUE(ValidateRankWorld(1, 2).ok());
  EXPECT_THAT(std::string(ValidateRankWorld(2, 2).message()), HasSubstr("rank must be in [0, 2), got 2"));
  EXPECT_THAT(std::string(ValidateRankWorld(0, 0).message()), HasSubstr("world must be >= 1, got 0"));
}

TEST(ParseHostPortTest, AcceptsHostsAndRefusesGarbage) {
  auto a = ParseHostPort("127.0.0.1:29500");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 29500);
  auto b = ParseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  EXPECT_FALSE(ParseHostPort("leader").ok());
  EXPECT_FALSE(ParseHostPort("leader:").ok());
  EXPECT_FALSE(ParseHostPort("leader:99999").ok());
  EXPECT_FALSE(ParseHostPort("leader:http").ok());
}

TEST(TcpStoreTest, SetGetWaitAcrossClients) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = TcpStoreClient::Connect((*server)->Address(), milliseconds(2000));
  auto b = TcpStoreClient::Connect((*server)->Address(), milliseconds(2000));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<char> value(70'000);
  std::mt19937 rng(std::random_device{}());
  for (auto& c : value) c = static_cast<char>(rng());
  // b waits for a key that a sets a little later.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    (*a)->set("k", value);
  });
  (*b)->wait({"k"}, milliseconds(3000));
  setter.join();
  EXPECT_EQ((*b)->get("k"), value);
  (*a)->set("k", {'z'});  // overwrite
  EXPECT_EQ((*b)->get("k"), std::vector<char>{'z'});
}

TEST(TcpStoreTest, WaitTimesOutNamingTheMissingKeys) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto c = TcpStoreClient::Connect((*server)->Address(), milliseconds(2000));
  ASSERT_TRUE(c.ok());
  (*c)->set("present", {'1'});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (*c)->wait({"present", "absent"}, milliseconds(300));
    FAIL() << "wait returned for a missing key";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("absent"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("present")));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
}

TEST(TcpStoreTest, ClientFailsWhenTheServerGoesAway) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto c = TcpStoreClient::Connect((*server)->Address(), milliseconds(2000));
  ASSERT_TRUE(c.ok());
  server->reset();
  EXPECT_THROW((*c)->set("k", {'1'}), gloo::IoException);
}

TEST(GlooCommunicatorTest, RefusesBadArguments) {
  GlooOptions options;
  options.store_addr = "127.0.0.1:1";
  EXPECT_EQ(GlooCommunicator::Create(3, 2, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.store_addr = "no-port";
  EXPECT_EQ(GlooCommunicator::Create(0, 2, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.store_addr = "127.0.0.1:1";
  options.comm.timeout = milliseconds(0);
  EXPECT_EQ(GlooCommunicator::Create(0, 2, options).status().code(), absl::StatusCode::kInvalidArgument);
}

// Two ranks as threads of this process: the same code path as separate processes, quick to run.
TEST(GlooCommunicatorTest, TwoThreadsAllReduce) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  GlooOptions options;
  options.store_addr = (*server)->Address();
  options.comm.startup_timeout = milliseconds(10'000);
  std::vector<float> out[2];
  absl::Status status[2];
  auto run = [&](int rank) {
    auto comm = GlooCommunicator::Create(rank, 2, options);
    if (!comm.ok()) {
      status[rank] = comm.status();
      return;
    }
    out[rank] = {1.5f * (rank + 1), -2.0f, 1e-3f * rank};
    status[rank] = (*comm)->AllReduceSum(out[rank].data(), out[rank].size());
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(out[r], (std::vector<float>{4.5f, -4.0f, 1e-3f}));
  }
}

}  // namespace
}  // namespace dsv4::comm
