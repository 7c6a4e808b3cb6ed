// tp_model_peer: one rank of a tensor-parallel CPU group running the real DeepSeek-V4 model, started by comm_test.
//
//   tp_model_peer --rank=R --world=W --store=127.0.0.1:PORT --checkpoint=DIR --prompt=FILE --max_new=8 --out=PREFIX
//
// Every rank loads only its shard (Dsv4Model with ModelOptions::shard + the worker's collectives) and runs the same greedy generation
// (chunked prefill of the prompt, then max_new decode steps) in lock-step; rank 0 writes PREFIX.logits.npy (every
// position's logits) and PREFIX.tokens (the generated ids) for the test to compare across world sizes.
// World 1 runs without a communicator (the unsharded model). Exit codes: 0 ok, 2 bad input, 3 failure.
//
// --lockstep: the way a worker group runs. Rank 0 drives the worker's executor (LoadDsv4Executor) wrapped in a
// LockstepLeader (every call broadcast as a StepPlan); the other ranks only run RunFollower. Rank 0 writes the
// last-token logits of each step (prefill chunk ends, then each decode step) and PREFIX.positions with their
// positions.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "comm/gloo_communicator.h"
#include "common/logging.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/dsv4/model.h"
#include "worker/dsv4_executor.h"
#include "worker/lockstep.h"
#include "worker/model_hooks.h"
#include "tools/generate/npy.h"
#include "tools/generate/runner.h"

ABSL_FLAG(int, rank, 0, "this process's rank");
ABSL_FLAG(int, world, 1, "ranks in the group");
ABSL_FLAG(std::string, store, "", "host:port of the rendezvous store (world > 1)");
ABSL_FLAG(std::string, checkpoint, "", "checkpoint folder");
ABSL_FLAG(std::string, prompt, "", "file of whitespace-separated prompt token ids");
ABSL_FLAG(int, max_new, 8, "greedy tokens to generate");
ABSL_FLAG(int, prefill_chunk, 64, "prefill chunk size");
ABSL_FLAG(std::string, out, "", "output prefix (rank 0)");
ABSL_FLAG(bool, lockstep, false, "rank 0 drives a LockstepLeader, the others RunFollower");

namespace {

using dsv4::worker::BlockTables;
using dsv4::worker::SeqChunk;

// Rank 0 of a lock-step group: greedy generation through the executor interface only.
int LeadLockstep(dsv4::comm::Communicator* comm, std::unique_ptr<dsv4::worker::ModelExecutor> local,
                 const std::vector<int32_t>& prompt, int max_new, int chunk, const std::string& out) {
  dsv4::worker::LockstepLeader lead(std::move(local), comm, {});
  const int page_rows = 64, V = lead.info().vocab_size;
  const int64_t max_len = static_cast<int64_t>(prompt.size()) + max_new;
  BlockTables tables;
  tables.state_slot = 0;
  std::array<int64_t, 4> pages{};
  for (int p = 0; p < 4; ++p) {
    pages[p] = (lead.RowsNeeded(static_cast<dsv4::worker::Pool>(p), max_len) + page_rows - 1) / page_rows;
    for (int64_t k = 0; k < pages[p]; ++k) tables.pages[p].push_back(static_cast<int32_t>(pages[p] - 1 - k));
  }
  std::vector<float> logits(V), rows;
  std::vector<int64_t> positions;
  std::vector<int32_t> seq = prompt, generated;
  auto step = [&](int32_t start, size_t n) {
    const SeqChunk c{.tables = &tables, .tokens = std::span<const int32_t>(seq).subspan(start, n), .start_pos = start};
    const absl::Status s = lead.Forward({&c, 1}, logits.data());
    rows.insert(rows.end(), logits.begin(), logits.end());
    positions.push_back(start + static_cast<int64_t>(n) - 1);
    return s;
  };
  absl::Status s = lead.AllocateCache(pages, page_rows, 1);
  if (s.ok()) s = lead.ResetState(0);
  for (size_t start = 0; s.ok() && start < prompt.size(); start += chunk) {
    s = step(static_cast<int32_t>(start), std::min<size_t>(chunk, prompt.size() - start));
  }
  for (int i = 0; s.ok() && i < max_new; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(next);
    seq.push_back(next);
    s = step(static_cast<int32_t>(seq.size() - 1), 1);
  }
  if (!s.ok()) {
    std::printf("rank 0 LOCKSTEP ERROR: %s\n", s.ToString().c_str());
    return 3;
  }
  if (auto w = dsv4::npy::WriteF32(out + ".logits.npy", rows.data(), {static_cast<int64_t>(positions.size()), V});
      !w.ok()) {
    return 3;
  }
  std::ofstream t(out + ".tokens"), p(out + ".positions");
  for (int32_t id : generated) t << id << " ";
  for (int64_t pos : positions) p << pos << " ";
  std::printf("rank 0 led %zu lock-step forwards\n", positions.size());
  return 0;
}

int Run() {
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world);
  std::vector<int32_t> prompt;
  {
    std::ifstream in(absl::GetFlag(FLAGS_prompt));
    for (int32_t t; in >> t;) prompt.push_back(t);
  }
  if (prompt.empty()) {
    std::printf("rank %d: empty prompt file\n", rank);
    return 2;
  }
  std::unique_ptr<dsv4::comm::Communicator> comm;
  if (world > 1) {
    dsv4::comm::GlooOptions g;
    g.store_addr = absl::GetFlag(FLAGS_store);
    auto c = dsv4::comm::GlooCommunicator::Create(rank, world, g);
    if (!c.ok()) {
      std::printf("rank %d STARTUP ERROR: %s\n", rank, c.status().ToString().c_str());
      return 3;
    }
    comm = std::move(*c);
  }
  const int max_new = absl::GetFlag(FLAGS_max_new);
  const int64_t max_len = static_cast<int64_t>(prompt.size()) + max_new;
  const int chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (absl::GetFlag(FLAGS_lockstep) && world > 1) {
    // The way a worker group runs: the worker's own executor (backend + model + collectives) on every rank.
    auto local = dsv4::worker::LoadDsv4Executor({.checkpoint = absl::GetFlag(FLAGS_checkpoint), .threads = 1,
                                                 .max_step_tokens = chunk, .max_context = max_len,
                                                 .tp_comm = comm.get()});
    if (!local.ok()) {
      std::printf("rank %d LOAD ERROR: %s\n", rank, local.status().ToString().c_str());
      return 3;
    }
    std::printf("rank %d of %d loaded: resident %lld MiB\n", rank, world,
                static_cast<long long>(dsv4::model::ResidentBytes() >> 20));
    if (rank == 0) return LeadLockstep(comm.get(), std::move(*local), prompt, max_new, chunk, absl::GetFlag(FLAGS_out));
    const absl::Status s = dsv4::worker::RunFollower(*comm, **local);
    std::printf("rank %d follower: %s\n", rank, s.ToString().c_str());
    return s.ok() ? 0 : 3;
  }
  // The model alone, each rank with its shard and the worker's collectives adapter.
  std::unique_ptr<dsv4::kernels::Backend> backend = dsv4::kernels::cpu::MakeCpuBackend(1);
  std::unique_ptr<dsv4::worker::CommCollectives> collectives;
  dsv4::model::ModelOptions options{.mode = dsv4::model::NumericMode::kExact, .backend = backend.get(),
                                    .max_step_tokens = chunk, .max_context = max_len};
  if (comm != nullptr) {
    auto config = dsv4::LoadConfig(absl::GetFlag(FLAGS_checkpoint));
    auto layout = config.ok() ? dsv4::model::PlanShardLayout(*config, {rank, world})
                              : absl::StatusOr<dsv4::model::ShardLayout>(config.status());
    if (!layout.ok()) {
      std::printf("rank %d LAYOUT ERROR: %s\n", rank, layout.status().ToString().c_str());
      return 3;
    }
    collectives = std::make_unique<dsv4::worker::CommCollectives>(comm.get(), *layout);
    options.shard = {rank, world};
    options.collectives = collectives.get();
  }
  auto model = dsv4::model::Dsv4Model::Load(absl::GetFlag(FLAGS_checkpoint), options);
  if (!model.ok()) {
    std::printf("rank %d LOAD ERROR: %s\n", rank, model.status().ToString().c_str());
    return 3;
  }
  std::printf("rank %d of %d loaded: resident %lld MiB\n", rank, world,
              static_cast<long long>(dsv4::model::ResidentBytes() >> 20));
  auto plan = dsv4::generate::AllocateSequences(**model, 1, max_len);
  if (!plan.ok()) {
    std::printf("rank %d ALLOCATE ERROR: %s\n", rank, plan.status().ToString().c_str());
    return 3;
  }
  auto gen = dsv4::generate::Greedy(**model, plan->tables[0], prompt, max_new, chunk, /*keep_logits=*/true);
  if (!gen.ok()) {
    std::printf("rank %d FORWARD ERROR: %s\n", rank, gen.status().ToString().c_str());
    return 3;
  }
  std::printf("rank %d generated %zu tokens (prefill %.2f s, decode %.2f s)\n", rank, gen->tokens.size(),
              gen->prefill_seconds, gen->decode_seconds);
  if (rank == 0) {
    const std::string out = absl::GetFlag(FLAGS_out);
    const int64_t vocab = (*model)->config().vocab_size;
    const int64_t rows = static_cast<int64_t>(gen->logits.size()) / vocab;
    if (auto s = dsv4::npy::WriteF32(out + ".logits.npy", gen->logits.data(), {rows, vocab}); !s.ok()) {
      std::printf("rank 0 WRITE ERROR: %s\n", s.ToString().c_str());
      return 3;
    }
    std::ofstream t(out + ".tokens");
    for (int32_t id : gen->tokens) t << id << " ";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  dsv4::InitLogging("tp_model_peer", absl::GetFlag(FLAGS_rank));
  return Run();
}
