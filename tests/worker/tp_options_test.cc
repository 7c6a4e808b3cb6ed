// The tensor-parallel flags of dsv4-worker (--world, --rank, --leader, --host, --startup-timeout, --comm-timeout):
// every bad combination is refused before anything loads, with a message naming the flag.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/options.h"

namespace dsv4::worker {
namespace {

using ::testing::HasSubstr;

WorkerOptions Rank(int rank, int world) {
  WorkerOptions o;
  o.checkpoint = "/nonexistent/ckpt";  // not opened by ValidateOptions
  o.kv_pages = 64;
  o.rank = rank;
  o.world = world;
  return o;
}

void ExpectRefused(const WorkerOptions& o, const std::string& names) {
  const absl::Status s = ValidateOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(names));
}

TEST(TpOptions, ValidGroupsPass) {
  EXPECT_TRUE(ValidateOptions(Rank(0, 1)).ok());
  EXPECT_TRUE(ValidateOptions(Rank(0, 4)).ok()) << "the leader needs no --leader";
  WorkerOptions f = Rank(3, 4);
  f.leader = "10.0.0.1:50051";
  EXPECT_TRUE(ValidateOptions(f).ok()) << ValidateOptions(f);
}

TEST(TpOptions, FollowerNeedsAWellFormedLeader) {
  ExpectRefused(Rank(1, 2), "--leader is required on rank 1");
  WorkerOptions f = Rank(1, 2);
  f.leader = "no-port";
  ExpectRefused(f, "--leader 'no-port'");
  f.leader = "host:70000";
  ExpectRefused(f, "--leader 'host:70000'");
}

TEST(TpOptions, RankWorldAndTimeoutsAreRangeChecked) {
  ExpectRefused(Rank(2, 2), "--rank 2 must lie in [0, 1]");
  ExpectRefused(Rank(-1, 2), "--rank -1");
  ExpectRefused(Rank(0, 0), "--world 0");
  WorkerOptions o = Rank(0, 2);
  o.startup_timeout_s = 0;
  ExpectRefused(o, "--startup-timeout 0 must be > 0");
  o = Rank(0, 2);
  o.comm_timeout_s = -1;
  ExpectRefused(o, "--comm-timeout -1 must be > 0");
  o = Rank(0, 2);
  o.host = "";
  ExpectRefused(o, "--host");
}

}  // namespace
}  // namespace dsv4::worker
