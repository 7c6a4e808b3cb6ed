// dsv4-bench: a serving load generator in the style of sglang.bench_serving, for the dsv4.v1.Coordinator API.
//
//   dsv4-bench --target 127.0.0.1:50051 --num-prompts 64 --random-input-len 128 --random-output-len 32
//              --random-range-ratio 0.5 --concurrency 1,4,16 --output-json results.json
//   dsv4-bench --target HOST:PORT --dataset file --dataset-path prompts.jsonl --request-rate 4 --concurrency 64
//   dsv4-bench --target dsv4.example.com:443 --tls-ca ca.crt --token-file token ...   (docs/security.md)
//
// Prints one table row per sweep point (request throughput, token throughput, TTFT/TPOT/ITL mean and
// percentiles) and the same numbers as JSON. Exits 1 when any request failed. See docs/coordinator.md.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "bench/serving/runner.h"
#include "bench/serving/stats.h"
#include "bench/serving/workload.h"
#include "common/tls_options.h"
#include "coordinator/dashed_flags.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

ABSL_FLAG(std::string, target, "", "coordinator host:port");
ABSL_FLAG(std::string, dataset, "random", "random | file");
ABSL_FLAG(std::string, dataset_path, "", "JSON lines {\"prompt_token_ids\": [...], \"output_len\": N} (--dataset file)");
ABSL_FLAG(int, num_prompts, 100, "requests per sweep point");
ABSL_FLAG(int, random_input_len, 256, "prompt length (upper bound when --random-range-ratio < 1)");
ABSL_FLAG(int, random_output_len, 64, "output length (upper bound when --random-range-ratio < 1)");
ABSL_FLAG(double, random_range_ratio, 1.0, "lengths uniform in [len * ratio, len]");
ABSL_FLAG(std::string, concurrency, "1", "max requests in flight; a comma list runs a sweep, e.g. 1,4,16");
ABSL_FLAG(double, request_rate, 0, "Poisson arrival rate (requests/s); 0 = as fast as --concurrency allows");
ABSL_FLAG(double, temperature, 0, "sampling temperature (0 = greedy)");
ABSL_FLAG(int, logprobs, -1,
          ">= 0: every request asks for log-probabilities with this many alternatives (0..20), to measure their cost");
ABSL_FLAG(uint64_t, seed, 1, "workload, arrival and sampling seed");
ABSL_FLAG(int, warmup, 1, "requests sent (and not measured) before the first sweep point");
ABSL_FLAG(std::string, output_json, "", "also write the JSON report here");
// A coordinator with TLS and tokens (docs/security.md).
ABSL_FLAG(bool, tls, false, "TLS even without --tls-ca (the system's CA certificates verify the coordinator)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA that signed the coordinator's certificate; turns TLS on");
ABSL_FLAG(std::string, tls_cert, "", "client certificate, for a coordinator that requires one (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_server_name, "", "name the coordinator's certificate carries; empty = host of --target");
ABSL_FLAG(std::string, token_file, "", "file whose first line is the bearer token sent on every call (needs TLS)");

namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "dsv4-bench: %s\n", m.c_str());
  return 2;
}

// TLS and the bearer token from the flags; the token is the file's first line that is not blank or a comment.
absl::StatusOr<dsv4::ChannelSecurity> ChannelSecurityFromFlags() {
  std::string token;
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> text = dsv4::ReadSecretFile("--token-file", path);
    if (!text.ok()) return text.status();
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (!line.empty() && line.front() != '#') {
        token = std::string(line);
        break;
      }
    }
    if (token.empty()) return absl::InvalidArgumentError("--token-file " + path + ": no token in the file");
  }
  dsv4::ClientTlsOptions tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  tls.use_tls = absl::GetFlag(FLAGS_tls);
  return dsv4::MakeChannelSecurity(tls, "", token);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("dsv4-bench --target HOST:PORT [--concurrency 1,4,16] [--num-prompts N] ...");
  std::vector<std::string> flag_storage;
  dsv4::UnderscoreFlagNames(argc, argv, flag_storage);
  absl::ParseCommandLine(argc, argv);
  const std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) return Fail("--target is required (the coordinator's host:port)");
  std::vector<int> sweep;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',', absl::SkipWhitespace())) {
    int v = 0;
    if (!absl::SimpleAtoi(c, &v) || v < 1) return Fail("--concurrency wants positive integers, e.g. 1,4,16");
    sweep.push_back(v);
  }
  if (sweep.empty()) return Fail("--concurrency is empty");
  if (absl::GetFlag(FLAGS_request_rate) < 0) return Fail("--request-rate must be >= 0");

  absl::StatusOr<dsv4::ChannelSecurity> security = ChannelSecurityFromFlags();
  if (!security.ok()) return Fail(std::string(security.status().message()));
  auto stub = dsv4::v1::Coordinator::NewStub(security->Connect(target));
  dsv4::v1::GetModelInfoResponse info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
    if (!s.ok()) return Fail("GetModelInfo on " + target + ": " + s.error_message());
  }
  absl::StatusOr<std::vector<dsv4::bench::BenchRequest>> requests;
  if (absl::GetFlag(FLAGS_dataset) == "random") {
    requests = dsv4::bench::MakeRandomWorkload({.num_prompts = absl::GetFlag(FLAGS_num_prompts),
                                                .input_len = absl::GetFlag(FLAGS_random_input_len),
                                                .output_len = absl::GetFlag(FLAGS_random_output_len),
                                                .range_ratio = absl::GetFlag(FLAGS_random_range_ratio),
                                                .vocab_size = info.vocab_size(),
                                                .seed = absl::GetFlag(FLAGS_seed)});
  } else if (absl::GetFlag(FLAGS_dataset) == "file") {
    requests = dsv4::bench::LoadTokenFile(absl::GetFlag(FLAGS_dataset_path), absl::GetFlag(FLAGS_random_output_len),
                                          info.vocab_size());
  } else {
    return Fail("--dataset must be random or file");
  }
  if (!requests.ok()) return Fail(std::string(requests.status().message()));
  std::printf("dsv4-bench: %s (%s, vocab %d, max context %d), %d of %d groups ready, %zu requests per point\n",
              target.c_str(), info.model_name().c_str(), info.vocab_size(), info.max_context(), info.ready_groups(),
              info.total_groups(), requests->size());

  dsv4::bench::RunOptions run{.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature)),
                              .top_logprobs = absl::GetFlag(FLAGS_logprobs),
                              .seed = absl::GetFlag(FLAGS_seed)};
  if (const int w = absl::GetFlag(FLAGS_warmup); w > 0) {
    std::vector<dsv4::bench::BenchRequest> warm(requests->begin(), requests->begin() + std::min<size_t>(w, requests->size()));
    double unused = 0;
    run.concurrency = static_cast<int>(warm.size());
    dsv4::bench::RunBenchmark(*stub, warm, run, &unused);
  }
  std::vector<dsv4::bench::Summary> rows;
  nlohmann::json report{{"target", target}, {"model", info.model_name()}, {"num_prompts", requests->size()}};
  bool any_failed = false;
  for (int c : sweep) {
    run.concurrency = c;
    run.request_rate = absl::GetFlag(FLAGS_request_rate);
    double duration = 0;
    const std::vector<dsv4::bench::RequestRecord> records = dsv4::bench::RunBenchmark(*stub, *requests, run, &duration);
    dsv4::bench::Summary s = dsv4::bench::Summarize(records, duration);
    s.concurrency = c;
    s.request_rate = run.request_rate;
    s.label = run.request_rate > 0 ? "c=" + std::to_string(c) + ",rate=" + std::to_string(run.request_rate)
                                   : "concurrency=" + std::to_string(c);
    std::printf("  %s: %d ok, %d failed in %.2f s%s%s\n", s.label.c_str(), s.completed, s.failed, duration,
                s.failed > 0 ? "; first error: " : "", s.first_error.c_str());
    std::fflush(stdout);
    any_failed |= s.failed > 0;
    report["runs"].push_back(dsv4::bench::ToJson(s));
    rows.push_back(std::move(s));
  }
  std::printf("\n%s\n%s\n", dsv4::bench::FormatTable(rows).c_str(), report.dump().c_str());
  if (const std::string path = absl::GetFlag(FLAGS_output_json); !path.empty()) {
    std::ofstream(path) << report.dump(2) << "\n";
  }
  return any_failed ? 1 : 0;
}
