// See worker_client.h.
#include "tests/worker/worker_client.h"

#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/worker/process_util.h"

namespace dsv4::worker::testing {

dsv4::v1::GenerateRequest Request(std::vector<int32_t> prompt, int max_new, float temperature, uint64_t seed) {
  dsv4::v1::GenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_token_ids(t);
  r.mutable_sampling()->set_max_new_tokens(max_new);
  r.mutable_sampling()->set_ignore_eos(true);  // dsv4-generate does not stop at eos either
  if (temperature > 0) {
    r.mutable_sampling()->set_temperature(temperature);
    r.mutable_sampling()->set_top_p(0.95f);
    r.mutable_sampling()->set_seed(seed);
  }
  return r;
}

Stream Generate(dsv4::v1::Worker::Stub* stub, const dsv4::v1::GenerateRequest& r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
  auto reader = stub->Generate(&ctx, r);
  Stream s;
  dsv4::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    for (int32_t t : msg.token_ids()) s.tokens.push_back(t);
    for (const auto& lp : msg.logprobs()) s.logprobs.push_back(lp);
    s.last = msg;
  }
  s.status = reader->Finish();
  return s;
}

std::vector<Stream> GenerateAll(dsv4::v1::Worker::Stub* stub, const std::vector<dsv4::v1::GenerateRequest>& reqs) {
  std::vector<Stream> out(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { out[i] = Generate(stub, reqs[i]); });
  for (auto& t : threads) t.join();
  return out;
}

std::vector<int32_t> ReferenceTokens(const std::string& checkpoint, const std::vector<int32_t>& prompt, int max_new,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {BinaryPath("tools/generate/dsv4-generate"), "--checkpoint", checkpoint,
                                   "--prompt-ids", absl::StrJoin(prompt, ","), "--max-new-tokens",
                                   std::to_string(max_new)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto out = RunAndCapture(argv, 300);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<int32_t> tokens;
  for (absl::string_view line : absl::StrSplit(out.value_or(""), '\n')) {
    if (!absl::ConsumePrefix(&line, "generated: ")) continue;
    for (absl::string_view t : absl::StrSplit(line, ',', absl::SkipEmpty())) {
      int32_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(t, &v)) << t;
      tokens.push_back(v);
    }
  }
  return tokens;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 2 + (i * 131 + salt * 977 + (i * i) % 13) % 4000;
  return p;
}

int64_t PagesUsed(dsv4::v1::Worker::Stub* stub) {
  grpc::ClientContext ctx;
  dsv4::v1::GetLoadResponse load;
  EXPECT_TRUE(stub->GetLoad(&ctx, {}, &load).ok());
  int64_t used = 0;
  for (const auto& p : load.kv_pools()) used += p.pages_used();
  return used;
}

bool WaitPagesFree(dsv4::v1::Worker::Stub* stub) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (PagesUsed(stub) != 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace dsv4::worker::testing
