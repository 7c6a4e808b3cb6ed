// Gloo worker groups of real processes on loopback: collectives against exact results for world 2 and 4, and the
// fault cases (a peer killed mid-run, a peer that hangs, a peer that never arrives) ending in bounded time.
// Each rank is a comm_peer process (tests/comm/comm_peer.cc); this test hosts the rendezvous store.
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"
#include "tests/comm/peer_group.h"

namespace dsv4::comm {
namespace {

using std::chrono::milliseconds;
using testing::GlooGroup;
using testing::MakeTempDir;
using testing::Subprocess;
using Clock = std::chrono::steady_clock;

void RunCollectives(int world) {
  GlooGroup g;
  g.Start(world, [&] {
    std::vector<int> r;
    for (int i = 0; i < world; ++i) r.push_back(i);
    return r;
  }(), {"--mode=collectives"});
  for (size_t i = 0; i < g.size(); ++i) {
    const auto code = g.peer(i).Wait(milliseconds(60'000));
    ASSERT_TRUE(code.has_value()) << "rank " << i << " did not finish; output:\n" << g.AllOutput();
    EXPECT_EQ(*code, 0) << "rank " << i << " (seed " << g.seed() << ") output:\n" << g.peer(i).Output();
  }
  std::printf("%s", g.AllOutput().c_str());
}

TEST(GlooProcessTest, CollectivesWorld2) { RunCollectives(2); }
TEST(GlooProcessTest, CollectivesWorld4) { RunCollectives(4); }

// A follower killed mid-run: the survivors' collectives fail with UNAVAILABLE. Usually at once (the closed sockets
// are noticed: 0.03 s), but Gloo's TCP transport does not release a send already waiting on the peer that died,
// and such a survivor is freed only by the collective deadline (seen in the ASan stage of CI, 2026-12-01: rank 0
// failed in 0.03 s, rank 2 was still waiting after 5 s; docs/tensor-parallel.md, known limits). So the deadline is
// 3 s and the bound 9 s: a death is never missed, whichever way it is found.
TEST(GlooProcessTest, KilledPeerFailsTheOthersFast) {
  constexpr int kBoundMs = 9'000;
  GlooGroup g;
  g.Start(3, {0, 1, 2}, {"--mode=loop", "--timeout_ms=3000"});
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g.peer(i).WaitForOutput("READY", milliseconds(20'000))) << g.AllOutput();
  }
  std::this_thread::sleep_for(milliseconds(200));  // let them run a few hundred steps
  const auto killed_at = Clock::now();
  g.peer(1).Signal(SIGKILL);
  for (int i : {0, 2}) {
    const auto code = g.peer(i).Wait(milliseconds(kBoundMs));
    const double s = std::chrono::duration<double>(Clock::now() - killed_at).count();
    ASSERT_TRUE(code.has_value()) << "rank " << i << " still running " << kBoundMs / 1000 << " s after its peer died:\n"
                                  << g.AllOutput();
    EXPECT_EQ(*code, 3) << g.peer(i).Output();
    EXPECT_NE(g.peer(i).Output().find("UNAVAILABLE"), std::string::npos) << g.peer(i).Output();
    std::printf("rank %d failed %.3f s after rank 1 was killed\n", i, s);
  }
}

// A peer that stops responding (SIGSTOP) without closing its sockets: the others fail at the collective deadline.
TEST(GlooProcessTest, HungPeerFailsTheOthersAtTheDeadline) {
  GlooGroup g;
  g.Start(2, {0, 1}, {"--mode=loop", "--timeout_ms=1500"});
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g.peer(i).WaitForOutput("READY", milliseconds(20'000))) << g.AllOutput();
  }
  const auto stopped_at = Clock::now();
  g.peer(1).Signal(SIGSTOP);
  const auto code = g.peer(0).Wait(milliseconds(10'000));
  const double s = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  g.peer(1).Signal(SIGKILL);
  ASSERT_TRUE(code.has_value()) << "rank 0 hung with a stopped peer:\n" << g.AllOutput();
  EXPECT_EQ(*code, 3) << g.peer(0).Output();
  EXPECT_NE(g.peer(0).Output().find("UNAVAILABLE"), std::string::npos) << g.peer(0).Output();
  EXPECT_GE(s, 1.0) << "failed before the deadline: " << g.peer(0).Output();
  std::printf("rank 0 failed %.3f s after rank 1 stopped (deadline 1.5 s)\n", s);
}

// Rank 2 of 3 never starts: ranks 0 and 1 give up at the start-up deadline with a message naming rank 2.
TEST(GlooProcessTest, MissingPeerFailsStartupWithClearTimeout) {
  GlooGroup g;
  g.Start(3, {0, 1}, {"--mode=startup", "--startup_ms=1500"});
  for (size_t i = 0; i < g.size(); ++i) {
    const auto code = g.peer(i).Wait(milliseconds(10'000));
    ASSERT_TRUE(code.has_value()) << "rank " << i << " hung waiting for a missing peer";
    EXPECT_EQ(*code, 4) << g.peer(i).Output();
    const std::string out = g.peer(i).Output();
    EXPECT_NE(out.find("DEADLINE_EXCEEDED"), std::string::npos) << out;
    EXPECT_NE(out.find("rank(s) 2 never arrived"), std::string::npos) << out;
  }
}

// A store that is not there at all: start-up fails with the address in the message, not a hang.
TEST(GlooProcessTest, UnreachableStoreFailsStartup) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const std::string addr = (*server)->Address();
  server->reset();  // nobody listens there any more
  const std::string dir = MakeTempDir("comm");
  Subprocess p = Subprocess::Start({DSV4_COMM_PEER, "--rank=1", "--world=2", "--store=" + addr, "--mode=startup",
                                    "--startup_ms=800"},
                                   dir + "/rank1.log");
  const auto code = p.Wait(milliseconds(10'000));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 4);
  EXPECT_NE(p.Output().find("cannot reach the rendezvous store at " + addr), std::string::npos) << p.Output();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4::comm
