// comm_peer: one rank of a Gloo worker group, started as a separate process by comm_test.
//
//   comm_peer --rank=R --world=W --store=127.0.0.1:PORT --mode=collectives --seed=S --dir=/tmp/x
//
// Modes (exit codes: 0 ok, 1 wrong result, 3 a collective failed, 4 the group did not form, 5 ran too long):
//   collectives  all-reduce fp32 and bf16 on fresh random data (seeded by --seed and the rank, so every rank can
//                regenerate everyone's inputs) against the exact sum in double; all-gather; broadcast from every
//                root; variable-length BroadcastBytes; a barrier that must wait for the slowest rank; and a check
//                that every rank holds bit-identical all-reduce results.
//   loop         prints READY once connected, then all-reduces in a loop until a collective fails (the fault tests
//                kill or stop a peer) and prints the status.
//   startup      only forms the group and prints the status.
//   lockstep     rank 0 drives a LockstepLeader over a fake model shard (allocate, resets, forwards with an
//                all-reduce inside, an idle spell with heartbeats, more forwards), the others RunFollower; every
//                rank prints the hash of the calls it applied ("calls=<hex>") for the test to compare.
//   lockstep_busy / lockstep_idle   the leader prints READY, then steps continuously / idles on heartbeats until
//                the group breaks (a follower is killed by the test); it prints NOT_SERVING from on_failure and
//                the UNAVAILABLE status of its next Forward, and exits 3.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "comm/gloo_communicator.h"
#include "worker/lockstep.h"
#include "common/float_formats.h"
#include "tests/comm/fake_executor.h"

ABSL_FLAG(int, rank, 0, "this process's rank");
ABSL_FLAG(int, world, 2, "ranks in the group");
ABSL_FLAG(std::string, store, "", "host:port of the rendezvous store");
ABSL_FLAG(std::string, mode, "collectives", "collectives | loop | startup");
ABSL_FLAG(uint64_t, seed, 1, "random seed shared by all ranks");
ABSL_FLAG(std::string, dir, "/tmp", "scratch directory shared by the ranks (barrier marker)");
ABSL_FLAG(int, timeout_ms, 20000, "collective deadline");
ABSL_FLAG(int, startup_ms, 20000, "group formation deadline");
ABSL_FLAG(int, loop_limit_s, 60, "loop mode gives up (exit 5) after this long");
ABSL_FLAG(int, heartbeat_ms, 300, "lockstep modes: the leader's heartbeat interval");

namespace dsv4::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<float> RandomFloats(uint64_t seed, int rank, size_t n) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::string RandomBytes(uint64_t seed, int rank, size_t n) {
  std::mt19937_64 rng(seed * 7919ull + static_cast<uint64_t>(rank) + 17);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// Relative error by norm ||got - want|| / ||want||; NaN anywhere counts as infinite error.
double RelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

uint64_t Fnv1a(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

#define PEER_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::printf("rank %d FAILED: %s\n", comm.rank(), absl::StrCat(__VA_ARGS__).c_str()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
#define PEER_OK(expr)                                                                        \
  do {                                                                                       \
    const absl::Status _s = (expr);                                                          \
    if (!_s.ok()) {                                                                          \
      std::printf("rank %d COLLECTIVE ERROR: %s\n", comm.rank(), _s.ToString().c_str());   \
      return 3;                                                                              \
    }                                                                                        \
  } while (0)

int CheckAllReduce(Communicator& comm, uint64_t seed, std::vector<uint64_t>* hashes) {
  const int w = comm.world();
  // Sizes: one element, not a multiple of the world, and large enough for several Gloo segments (1 MiB each).
  for (size_t n : {size_t{1}, size_t{1031}, size_t{700'001}}) {
    std::vector<float> data = RandomFloats(seed + n, comm.rank(), n);
    std::vector<double> want(n, 0.0);
    for (int r = 0; r < w; ++r) {
      const auto in = RandomFloats(seed + n, r, n);
      for (size_t i = 0; i < n; ++i) want[i] += in[i];
    }
    PEER_OK(comm.AllReduceSum(data.data(), n));
    const double err = RelErr(data, want);
    std::printf("rank %d fp32 allreduce n=%zu rel_err=%.3g\n", comm.rank(), n, err);
    PEER_CHECK(err <= 1e-6, "fp32 all-reduce n=", n, " rel err ", err, " > 1e-6");
    hashes->push_back(Fnv1a(data.data(), n * sizeof(float)));

    // bf16 inputs: fresh fp32 data rounded to bf16, so every rank can recompute the exact sum.
    std::vector<uint16_t> h(n);
    std::vector<double> want16(n, 0.0);
    for (int r = 0; r < w; ++r) {
      const auto in = RandomFloats(seed + 2 * n, r, n);
      for (size_t i = 0; i < n; ++i) want16[i] += Bf16ToF32(F32ToBf16(in[i]));
      if (r == comm.rank()) {
        for (size_t i = 0; i < n; ++i) h[i] = F32ToBf16(in[i]);
      }
    }
    PEER_OK(comm.AllReduceSumBf16(h.data(), n));
    std::vector<float> got16(n);
    size_t off_by_more_than_half_ulp = 0;
    for (size_t i = 0; i < n; ++i) {
      got16[i] = Bf16ToF32(h[i]);
      // One rounding at the end: the result is the exact sum rounded to bf16, give or take fp32 summation error.
      if (std::fabs(got16[i] - want16[i]) > std::ldexp(std::fabs(want16[i]), -8) + 1e-6) ++off_by_more_than_half_ulp;
    }
    const double err16 = RelErr(got16, want16);
    std::printf("rank %d bf16 allreduce n=%zu rel_err=%.3g\n", comm.rank(), n, err16);
    PEER_CHECK(err16 <= 4e-3 && off_by_more_than_half_ulp == 0, "bf16 all-reduce n=", n, " rel err ", err16, ", ",
               off_by_more_than_half_ulp, " elements off by more than one rounding");
    hashes->push_back(Fnv1a(h.data(), n * sizeof(uint16_t)));
  }
  return 0;
}

int CheckGatherBroadcast(Communicator& comm, uint64_t seed) {
  const int w = comm.world();
  const size_t bytes = 4099;
  const std::string mine = RandomBytes(seed, comm.rank(), bytes);
  std::string all(bytes * w, '\0');
  PEER_OK(comm.AllGather(mine.data(), all.data(), bytes));
  for (int r = 0; r < w; ++r) {
    PEER_CHECK(all.compare(r * bytes, bytes, RandomBytes(seed, r, bytes)) == 0, "all-gather chunk ", r, " wrong");
  }
  for (int root = 0; root < w; ++root) {
    std::string buf = comm.rank() == root ? RandomBytes(seed + 5, root, 777) : std::string(777, '\0');
    PEER_OK(comm.Broadcast(buf.data(), buf.size(), root));
    PEER_CHECK(buf == RandomBytes(seed + 5, root, 777), "broadcast from root ", root, " wrong");
    // Variable length: only the root knows the size.
    const size_t len = 100 + (seed + root) % 5000;
    std::string msg = comm.rank() == root ? RandomBytes(seed + 9, root, len) : std::string("stale");
    PEER_OK(BroadcastBytes(comm, &msg, root));
    PEER_CHECK(msg == RandomBytes(seed + 9, root, len), "BroadcastBytes from root ", root, " wrong (", msg.size(),
               " bytes)");
  }
  return 0;
}

// The last rank arrives late and leaves a marker just before entering; nobody may leave before the marker exists.
int CheckBarrier(Communicator& comm, const std::string& dir) {
  const std::string marker = absl::StrCat(dir, "/barrier-marker");
  if (comm.rank() == comm.world() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::FILE* f = std::fopen(marker.c_str(), "w");
    if (f != nullptr) std::fclose(f);
  }
  PEER_OK(comm.Barrier());
  PEER_CHECK(std::filesystem::exists(marker), "left the barrier before rank ", comm.world() - 1, " entered it");
  return 0;
}

int RunCollectives(Communicator& comm, uint64_t seed, const std::string& dir) {
  std::vector<uint64_t> hashes;
  if (int rc = CheckAllReduce(comm, seed, &hashes); rc != 0) return rc;
  if (int rc = CheckGatherBroadcast(comm, seed); rc != 0) return rc;
  if (int rc = CheckBarrier(comm, dir); rc != 0) return rc;
  // Every rank must hold the same bits after each all-reduce (lock-step ranks must not drift apart).
  std::vector<uint64_t> all(hashes.size() * comm.world());
  PEER_OK(comm.AllGather(hashes.data(), all.data(), hashes.size() * sizeof(uint64_t)));
  for (int r = 0; r < comm.world(); ++r) {
    for (size_t i = 0; i < hashes.size(); ++i) {
      PEER_CHECK(all[r * hashes.size() + i] == hashes[i], "all-reduce result ", i, " differs on rank ", r);
    }
  }
  std::printf("rank %d OK\n", comm.rank());
  return 0;
}

int RunLoop(Communicator& comm, int limit_s) {
  std::printf("rank %d READY\n", comm.rank());
  std::fflush(stdout);
  std::vector<float> data(1000, 1.0f);
  const auto end = Clock::now() + std::chrono::seconds(limit_s);
  for (long iter = 0; Clock::now() < end; ++iter) {
    std::fill(data.begin(), data.end(), 1.0f);
    PEER_OK(comm.AllReduceSum(data.data(), data.size()));
    PEER_CHECK(data[0] == static_cast<float>(comm.world()), "loop all-reduce gave ", data[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf("rank %d loop limit reached\n", comm.rank());
  return 5;
}

// One forward of two sequences on the leader, checked against the exact all-reduced result.
int LeaderStep(Communicator& comm, worker::ModelExecutor& leader, const worker::BlockTables tables[2], int step) {
  std::vector<int32_t> toks[2] = {{step, step + 1, 7}, {3 * step}};
  const worker::SeqChunk chunks[2] = {{.tables = &tables[0], .tokens = toks[0], .start_pos = step * 3},
                                      {.tables = &tables[1], .tokens = toks[1], .start_pos = step}};
  std::vector<float> logits(2 * testing::FakeShardExecutor::kVocab);
  PEER_OK(leader.Forward(chunks, logits.data()));
  const int w = comm.world();
  for (int i = 0; i < 2; ++i) {
    int64_t s = chunks[i].start_pos;
    for (int32_t t : toks[i]) s += t;
    for (int v = 0; v < testing::FakeShardExecutor::kVocab; ++v) {
      const float want = static_cast<float>(w * (w + 1) / 2 * (s + v));
      PEER_CHECK(logits[i * testing::FakeShardExecutor::kVocab + v] == want, "step ", step, " chunk ", i, " logit ", v,
                 " = ", logits[i * testing::FakeShardExecutor::kVocab + v], ", want ", want);
    }
  }
  return 0;
}

int RunLockstep(Communicator& comm, const std::string& mode, int heartbeat_ms, int limit_s) {
  if (comm.rank() != 0) {
    testing::FakeShardExecutor local(&comm);
    const absl::Status s = worker::RunFollower(comm, local);
    std::printf("rank %d follower: %s forwards=%d calls=%016llx\n", comm.rank(), s.ToString().c_str(),
                local.forwards(), static_cast<unsigned long long>(local.hash()));
    return s.ok() ? 0 : 3;
  }
  std::atomic<bool> failed{false};
  worker::LockstepOptions options;
  options.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  options.on_failure = [&](const absl::Status& s) {
    std::printf("rank 0 NOT_SERVING: %s\n", s.ToString().c_str());
    failed = true;
  };
  auto owned = std::make_unique<testing::FakeShardExecutor>(&comm);
  testing::FakeShardExecutor* fake = owned.get();
  worker::LockstepLeader leader(std::move(owned), &comm, options);
  worker::BlockTables tables[2];
  tables[0].state_slot = 0;
  tables[0].pages = {std::vector<int32_t>{1, 2}, {3}, {}, {4}};
  tables[1].state_slot = 1;
  tables[1].pages = {std::vector<int32_t>{5}, {6, 7}, {8}, {}};
  PEER_OK(leader.AllocateCache({8, 4, 2, 4}, 64, 4));
  PEER_OK(leader.ResetState(0));
  PEER_OK(leader.ResetState(1));
  // Refused on every rank alike; the group must stay in step.
  PEER_CHECK(leader.ResetState(99).code() == absl::StatusCode::kInvalidArgument, "bad slot not refused");
  const auto end = Clock::now() + std::chrono::seconds(limit_s);
  int step = 0;
  for (; step < 10; ++step) {
    if (int rc = LeaderStep(comm, leader, tables, step); rc != 0) return rc;
  }
  if (mode == "lockstep") {
    std::this_thread::sleep_for(std::chrono::milliseconds(4 * heartbeat_ms));  // idle: heartbeats keep it alive
    for (; step < 20; ++step) {
      if (int rc = LeaderStep(comm, leader, tables, step); rc != 0) return rc;
    }
    PEER_OK(leader.health());
    std::printf("rank 0 leader: forwards=%d calls=%016llx\n", fake->forwards(),
                static_cast<unsigned long long>(fake->hash()));
    return 0;
  }
  std::printf("rank 0 READY\n");
  std::fflush(stdout);
  while (Clock::now() < end) {
    if (mode == "lockstep_busy") {
      if (int rc = LeaderStep(comm, leader, tables, step++); rc != 0) return rc;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!failed) continue;
      if (int rc = LeaderStep(comm, leader, tables, step++); rc != 0) return rc;
    }
  }
  std::printf("rank 0 loop limit reached\n");
  return 5;
}

int Main() {
  GlooOptions options;
  options.store_addr = absl::GetFlag(FLAGS_store);
  options.comm.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.comm.startup_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_startup_ms));
  auto comm_or = GlooCommunicator::Create(absl::GetFlag(FLAGS_rank), absl::GetFlag(FLAGS_world), options);
  if (!comm_or.ok()) {
    std::printf("rank %d STARTUP ERROR: %s\n", absl::GetFlag(FLAGS_rank), comm_or.status().ToString().c_str());
    return 4;
  }
  Communicator& comm = **comm_or;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "startup") {
    std::printf("rank %d CONNECTED\n", comm.rank());
    return 0;
  }
  if (mode == "loop") return RunLoop(comm, absl::GetFlag(FLAGS_loop_limit_s));
  if (mode.starts_with("lockstep")) {
    return RunLockstep(comm, mode, absl::GetFlag(FLAGS_heartbeat_ms), absl::GetFlag(FLAGS_loop_limit_s));
  }
  return RunCollectives(comm, absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_dir));
}

}  // namespace
}  // namespace dsv4::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  return dsv4::comm::Main();
}
