// dsv4-group's per-rank command lines (worker/group_launch.h): what each rank gets, what only the leader keeps,
// and the flags the launcher refuses because it writes them itself.
#include "worker/group_launch.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dsv4::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void ExpectRefused(int world, const std::vector<std::string>& flags, const std::string& says) {
  auto r = GroupRankArgs(world, flags);
  ASSERT_FALSE(r.ok()) << "accepted: " << testing::PrintToString(flags);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(says));
}

TEST(GroupRankArgs, EveryRankGetsItsNumberDeviceAndTheLeadersLoopbackAddress) {
  auto r = GroupRankArgs(3, {"--checkpoint=/models/dsv4", "--listen=0.0.0.0:50061", "--backend=cuda",
                             "--metrics-listen=0.0.0.0:9401", "--health-listen=0.0.0.0:50062",
                             "--ready-file=/tmp/ready", "--max_batch=64", "--cuda-graphs"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_THAT((*r)[0], ElementsAre("--checkpoint=/models/dsv4", "--listen=0.0.0.0:50061", "--backend=cuda",
                                   "--metrics-listen=0.0.0.0:9401", "--health-listen=0.0.0.0:50062",
                                   "--ready-file=/tmp/ready", "--max_batch=64", "--cuda-graphs", "--rank=0",
                                   "--world=3", "--device=0", "--host=127.0.0.1"));
  // Followers: no public port, metrics, probe port or ready file of their own; they dial the leader on loopback.
  EXPECT_THAT((*r)[2], ElementsAre("--checkpoint=/models/dsv4", "--backend=cuda", "--max_batch=64", "--cuda-graphs",
                                   "--rank=2", "--world=3", "--device=2", "--host=127.0.0.1",
                                   "--leader=127.0.0.1:50061", "--listen=127.0.0.1:0"));
}

TEST(GroupRankArgs, AListenAddressOfOneInterfaceIsDialledThere) {
  auto r = GroupRankArgs(2, {"--checkpoint=/c", "--listen=10.1.2.3:7000"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[1], ::testing::Contains("--leader=10.1.2.3:7000"));
  for (const char* any : {"--listen=[::]:7000", "--listen=localhost:7000"}) {
    auto a = GroupRankArgs(2, {"--checkpoint=/c", any});
    ASSERT_TRUE(a.ok()) << any << ": " << a.status();
    EXPECT_THAT((*a)[1], ::testing::Contains("--leader=127.0.0.1:7000")) << any;
  }
}

TEST(GroupRankArgs, RefusesWhatItWouldGetWrong) {
  for (const char* owned : {"--rank=0", "--world=4", "--device=1", "--host=10.0.0.1", "--leader=a:1"}) {
    ExpectRefused(4, {"--checkpoint=/c", "--listen=0.0.0.0:1", owned}, "is set by dsv4-group for each rank");
  }
  ExpectRefused(2, {"--checkpoint=/c", "--listen=0.0.0.0:1", "--max-batch", "64"},
                "'64' is not a flag: write every worker flag as --name=value");
  ExpectRefused(2, {"--checkpoint=/c"}, "--listen=HOST:PORT is required");
  ExpectRefused(2, {"--checkpoint=/c", "--listen=0.0.0.0:0"}, "needs a fixed port");
  ExpectRefused(2, {"--checkpoint=/c", "--listen=nonsense"}, "must be host:port");
  ExpectRefused(0, {"--checkpoint=/c", "--listen=0.0.0.0:1"}, "--world 0 must lie in [1, 64]");
  ExpectRefused(65, {"--checkpoint=/c", "--listen=0.0.0.0:1"}, "--world 65");
}

}  // namespace
}  // namespace dsv4::worker
