// dsv4-make-checkpoint: writes a deterministic synthetic DeepSeek-V4 checkpoint for a config.json.
//
//   dsv4-make-checkpoint --config configs/tiny.json --seed 1 --out /tmp/tiny
//   dsv4-make-checkpoint --config configs/flash.json --layers 4 --shards 8 --experts nvfp4 --out /data/f4
//
// Same flags, same bytes, on any machine. See docs/checkpoint-generator.md.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tools/make_checkpoint/generator.h"

ABSL_FLAG(std::string, config, "", "config.json of the model to generate (required)");
ABSL_FLAG(uint64_t, seed, 0, "seed of the parameter values");
ABSL_FLAG(std::string, out, "", "output folder (created if missing; required)");
ABSL_FLAG(int32_t, shards, 1, "number of safetensors shards (1: model.safetensors)");
ABSL_FLAG(std::string, experts, "nvfp4", "routed-expert format of the main layers: nvfp4 or mxfp4");
ABSL_FLAG(int64_t, layers, 0, "keep only the first N main layers (0: all)");
ABSL_FLAG(int32_t, threads, 0, "generator threads (0: all hardware threads; output is the same)");
ABSL_FLAG(bool, overwrite, false, "replace a checkpoint already in --out");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "dsv4-make-checkpoint: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a deterministic synthetic DeepSeek-V4 checkpoint.\n"
      "  dsv4-make-checkpoint --config FILE --seed N --out DIR [--shards K] [--experts nvfp4|mxfp4] [--layers N]");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(std::string("unexpected argument \"") + rest[1] + "\" (all options are --flags)");
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) return Fail("--config: missing (path of a config.json)");
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return Fail("--config " + config_path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();

  dsv4::gen::GeneratorOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.out_dir = absl::GetFlag(FLAGS_out);
  options.shards = absl::GetFlag(FLAGS_shards);
  options.layers = absl::GetFlag(FLAGS_layers);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.overwrite = absl::GetFlag(FLAGS_overwrite);
  if (options.layers < 0) return Fail("--layers: must be >= 0");
  if (options.threads < 0) return Fail("--threads: must be >= 0");
  absl::StatusOr<dsv4::ExpertFormat> experts = dsv4::ParseExpertFormat(absl::GetFlag(FLAGS_experts));
  if (!experts.ok()) return Fail(std::string("--experts: ") + std::string(experts.status().message()));
  options.experts = *experts;

  const absl::Time start = absl::Now();
  absl::StatusOr<dsv4::gen::GenerateSummary> summary = dsv4::gen::GenerateCheckpoint(text.str(), options);
  if (!summary.ok()) return Fail(config_path + ": " + std::string(summary.status().message()));
  std::printf("wrote %s (seed %llu, %s experts, %d shard%s) in %.1f s\n%s", options.out_dir.c_str(),
              static_cast<unsigned long long>(options.seed), std::string(dsv4::ExpertFormatName(options.experts)).c_str(),
              options.shards, options.shards == 1 ? "" : "s", absl::ToDoubleSeconds(absl::Now() - start),
              summary->ToString().c_str());
  return 0;
}
