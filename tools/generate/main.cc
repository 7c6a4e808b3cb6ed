// dsv4-generate: runs the DeepSeek-V4 model in one process (no gRPC, no engine): prefill a prompt of token
// ids, decode greedily, print the tokens and tokens/s, optionally dump every position's logits as .npy.
//   dsv4-generate --checkpoint DIR --prompt-ids 1,2,3 --max-new-tokens N [--mode exact|production]
//                 [--dump-logits FILE] [--prefill-chunk N] [--backend cpu|cuda] [--attention-kernel mma|simt] [--threads N]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/backend_factory.h"
#include "tools/generate/npy.h"
#include "tools/generate/runner.h"

ABSL_FLAG(std::string, checkpoint, "", "checkpoint folder (config.json + safetensors)");
ABSL_FLAG(std::string, prompt_ids, "", "comma-separated prompt token ids");
ABSL_FLAG(int, max_new_tokens, 16, "tokens to generate greedily");
ABSL_FLAG(std::string, mode, "exact", "numeric mode: exact (fp32, transformers) or production (FP8 KV, FP4 indexer)");
ABSL_FLAG(std::string, dump_logits, "", "write float32 logits of every position [rows, vocab] to this .npy");
ABSL_FLAG(int, prefill_chunk, 0, "prefill chunk size (0: the whole prompt in one chunk)");
ABSL_FLAG(std::string, backend, "cpu", "compute backend: cpu | cuda");
ABSL_FLAG(std::string, attention_kernel, "mma", "cuda backend: sparse-MLA decode kernel, mma | simt");
ABSL_FLAG(int, threads, 2, "CPU threads (cpu backend)");

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "dsv4-generate: %s\n", msg.c_str());
  return 1;
}

// The documented spelling is --prompt-ids; absl flags are identifiers, so dashes in flag names become '_'.
std::vector<std::string> NormaliseFlagNames(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t j = 2; j < end; ++j)
      if (a[j] == '-') a[j] = '_';
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("dsv4-generate --checkpoint DIR --prompt-ids 1,2,3 --max-new-tokens N");
  std::vector<std::string> args = NormaliseFlagNames(argc, argv);
  std::vector<char*> argp;
  for (std::string& a : args) argp.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(argp.size()), argp.data());
  using dsv4::model::NumericMode;
  dsv4::model::ModelOptions opts;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "exact") opts.mode = NumericMode::kExact;
  else if (mode == "production") opts.mode = NumericMode::kProduction;
  else return Fail("--mode must be exact or production, got \"" + mode + "\"");
  if (absl::GetFlag(FLAGS_checkpoint).empty()) return Fail("--checkpoint is required");
  auto backend = dsv4::kernels::MakeBackend({.name = absl::GetFlag(FLAGS_backend), .threads = absl::GetFlag(FLAGS_threads),
                                             .attention_kernel = absl::GetFlag(FLAGS_attention_kernel)});
  if (!backend.ok()) return Fail(backend.status().ToString());
  opts.backend = backend->get();
  std::vector<int32_t> prompt;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(s, &v)) return Fail("--prompt-ids: \"" + std::string(s) + "\" is not an integer");
    prompt.push_back(v);
  }
  if (prompt.empty()) return Fail("--prompt-ids is required (comma-separated token ids)");
  const int max_new = absl::GetFlag(FLAGS_max_new_tokens);
  if (max_new < 0) return Fail("--max-new-tokens must be >= 0");

  opts.max_context = static_cast<int64_t>(prompt.size()) + max_new;
  const int chunk = absl::GetFlag(FLAGS_prefill_chunk);
  opts.max_step_tokens = chunk > 0 ? std::min<int64_t>(chunk, opts.max_context) : opts.max_context;
  auto model = dsv4::model::Dsv4Model::Load(absl::GetFlag(FLAGS_checkpoint), opts);
  if (!model.ok()) return Fail(model.status().ToString());
  auto plan = dsv4::generate::AllocateSequences(**model, 1, static_cast<int64_t>(prompt.size()) + max_new);
  if (!plan.ok()) return Fail(plan.status().ToString());
  const std::string dump = absl::GetFlag(FLAGS_dump_logits);
  auto gen = dsv4::generate::Greedy(**model, plan->tables[0], prompt, max_new, absl::GetFlag(FLAGS_prefill_chunk),
                                    !dump.empty());
  if (!gen.ok()) return Fail(gen.status().ToString());
  std::printf("generated: %s\n", absl::StrJoin(gen->tokens, ",").c_str());
  std::printf("prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), gen->prefill_seconds,
              prompt.size() / gen->prefill_seconds);
  std::printf("decode: %d tokens in %.3f s (%.1f tokens/s, mode %s, backend %s)\n", max_new, gen->decode_seconds,
              max_new > 0 ? max_new / gen->decode_seconds : 0.0, mode.c_str(), opts.backend->name().c_str());
  if (!dump.empty()) {
    const int64_t V = (*model)->config().vocab_size;
    auto st = dsv4::npy::WriteF32(dump, gen->logits.data(), {static_cast<int64_t>(gen->logits.size()) / V, V});
    if (!st.ok()) return Fail(st.ToString());
    std::printf("logits: %s\n", dump.c_str());
  }
  return 0;
}
