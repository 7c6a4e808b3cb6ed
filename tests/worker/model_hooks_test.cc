// The worker's adapters to the model's hooks (worker/model_hooks.h): the vocabulary gather of CommCollectives over
// a real 3-rank Gloo group (threads of this process on loopback) with a ragged split, and the phase mapping.
#include <cmath>
#include <random>
#include <thread>

#include "comm/gloo_communicator.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"
#include "worker/model_hooks.h"

namespace dsv4::worker {
namespace {

TEST(CommCollectivesTest, GatherVocabThreeRanksRaggedVocab) {
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  Config c;
  c.num_attention_heads = 6;
  c.o_groups = 3;
  c.n_routed_experts = 6;
  c.moe_intermediate_size = 6;
  c.n_shared_experts = 1;
  c.vocab_size = 10;  // slots of 4: ranks hold 4, 4, 2
  const int64_t rows = 2, V = 10;
  std::vector<float> want(rows * V);
  std::mt19937 rng(std::random_device{}());
  for (auto& v : want) v = std::uniform_real_distribution<float>(-5, 5)(rng);
  std::vector<std::vector<float>> got(3, std::vector<float>(rows * V, NAN));
  absl::Status status[3];
  auto run = [&](int rank) {
    comm::GlooOptions o;
    o.store_addr = (*server)->Address();
    auto comm = comm::GlooCommunicator::Create(rank, 3, o);
    auto l = model::PlanShardLayout(c, {rank, 3});
    if (!comm.ok() || !l.ok()) {
      status[rank] = comm.ok() ? l.status() : comm.status();
      return;
    }
    CommCollectives coll(comm->get(), *l);
    std::vector<float> local(rows * l->vocab.size);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = 0; v < l->vocab.size; ++v) local[r * l->vocab.size + v] = want[r * V + l->vocab.begin + v];
    status[rank] = coll.GatherVocab(local.data(), rows, V, got[rank].data());
  };
  std::thread t0(run, 0), t1(run, 1), t2(run, 2);
  t0.join();
  t1.join();
  t2.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], want) << "rank " << r;
  }
}

TEST(PhaseTimerHookTest, MapsEveryPhase) {
  EXPECT_EQ(PhaseTimerHook::ToMetrics(model::Phase::kAttention), metrics::Phase::kAttention);
  EXPECT_EQ(PhaseTimerHook::ToMetrics(model::Phase::kMoe), metrics::Phase::kMoe);
  EXPECT_EQ(PhaseTimerHook::ToMetrics(model::Phase::kDense), metrics::Phase::kDense);
  EXPECT_EQ(PhaseTimerHook::ToMetrics(model::Phase::kComm), metrics::Phase::kComm);
  EXPECT_EQ(PhaseTimerHook::ToMetrics(model::Phase::kOther), metrics::Phase::kOther);
}

}  // namespace
}  // namespace dsv4::worker
