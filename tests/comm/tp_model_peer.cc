// tp_model_peer: one rank of a tensor-parallel CPU group running the real DeepSeek-V4 model, started by comm_test.
//
//   tp_model_peer --rank=R --world=W --store=127.0.0.1:PORT --checkpoint=DIR --prompt=FILE --max_new=8 --out=PREFIX
//
// Every rank loads only its shard (Dsv4Model with ModelOptions::tp_comm) and runs the same greedy generation
// (chunked prefill of the prompt, then max_new decode steps) in lock-step; rank 0 writes PREFIX.logits.npy (every
// position's logits) and PREFIX.tokens (the generated ids) for the test to compare across world sizes.
// World 1 runs without a communicator (the unsharded model). Exit codes: 0 ok, 2 bad input, 3 failure.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "comm/gloo_communicator.h"
#include "comm/shard.h"
#include "common/logging.h"
#include "model/dsv4/model.h"
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

namespace {

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
  dsv4::model::ModelOptions options{.mode = dsv4::model::NumericMode::kExact, .num_threads = 1,
                                    .tp_comm = comm.get()};
  auto model = dsv4::model::Dsv4Model::Load(absl::GetFlag(FLAGS_checkpoint), options);
  if (!model.ok()) {
    std::printf("rank %d LOAD ERROR: %s\n", rank, model.status().ToString().c_str());
    return 3;
  }
  std::printf("rank %d of %d loaded: resident %lld MiB\n", rank, world,
              static_cast<long long>(dsv4::comm::ResidentBytes() >> 20));
  const int max_new = absl::GetFlag(FLAGS_max_new);
  auto plan = dsv4::generate::AllocateSequences(**model, 1, static_cast<int64_t>(prompt.size()) + max_new);
  if (!plan.ok()) {
    std::printf("rank %d ALLOCATE ERROR: %s\n", rank, plan.status().ToString().c_str());
    return 3;
  }
  auto gen = dsv4::generate::Greedy(**model, plan->tables[0], prompt, max_new, absl::GetFlag(FLAGS_prefill_chunk),
                                    /*keep_logits=*/true);
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
