// dsv4-worker-bench: closed-loop throughput of one worker over its Worker gRPC API (no coordinator).
//   dsv4-worker-bench --target 127.0.0.1:PORT --batches 1,8,32 --prompt-len 32 --output-len 64
// For each batch size B it starts B streams at once (random prompts, ignore_eos, greedy), waits for all, and
// prints generated tokens / wall time (prefill included), the steady decode rate B / mean inter-token latency,
// and the mean inter-token latency.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, target, "", "worker host:port");
ABSL_FLAG(std::string, batches, "1,8,32", "concurrent streams per point (comma list)");
ABSL_FLAG(int, prompt_len, 32, "prompt tokens per request");
ABSL_FLAG(int, output_len, 64, "generated tokens per request");
ABSL_FLAG(int, vocab, 4096, "token ids are drawn from [2, vocab)");

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  Clock::time_point first, last;
  int tokens = 0;
  bool ok = false;
};

Result RunOne(dsv4::v1::Worker::Stub* stub, int prompt_len, int output_len, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  dsv4::v1::GenerateRequest r;
  for (int i = 0; i < prompt_len; ++i) r.add_prompt_token_ids(2 + static_cast<int>(rng() % (vocab - 2)));
  r.mutable_sampling()->set_max_new_tokens(output_len);
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, r);
  dsv4::v1::GenerateResponse msg;
  Result res;
  while (reader->Read(&msg)) {
    if (res.tokens == 0) res.first = Clock::now();
    res.tokens += msg.token_ids_size();
    res.last = Clock::now();
  }
  res.ok = reader->Finish().ok();
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto stub = dsv4::v1::Worker::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials()));
  const int p = absl::GetFlag(FLAGS_prompt_len), n = absl::GetFlag(FLAGS_output_len);
  std::printf("| batch | prompt | output | wall s | output tok/s | decode tok/s | mean ITL ms |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int batch = 0;
    if (!absl::SimpleAtoi(b, &batch) || batch < 1) {
      std::fprintf(stderr, "dsv4-worker-bench: --batches entry '%s' is not a positive integer\n",
                   std::string(b).c_str());
      return 2;
    }
    std::vector<Result> results(batch);
    std::vector<std::thread> threads;
    const auto start = Clock::now();
    for (int i = 0; i < batch; ++i) {
      threads.emplace_back([&, i] {
        results[i] = RunOne(stub.get(), p, n, 1000 + i, absl::GetFlag(FLAGS_vocab));
      });
    }
    for (auto& t : threads) t.join();
    const auto end = Clock::now();
    int64_t tokens = 0;
    double itl_sum = 0;
    for (const Result& r : results) {
      if (!r.ok) {
        std::fprintf(stderr, "dsv4-worker-bench: a stream failed at batch %d\n", batch);
        return 1;
      }
      tokens += r.tokens;
      if (r.tokens > 1) itl_sum += std::chrono::duration<double>(r.last - r.first).count() / (r.tokens - 1);
    }
    const double wall = std::chrono::duration<double>(end - start).count();
    const double itl = itl_sum / batch;  // seconds
    std::printf("| %d | %d | %d | %.2f | %.1f | %.1f | %.1f |\n", batch, p, n, wall, tokens / wall,
                batch / std::max(1e-9, itl), 1000 * itl);
  }
  return 0;
}
