// See options.h.
#include "worker/options.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4::worker {
namespace {

absl::Status Range(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, " must lie in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseHostPort(const std::string& flag, const std::string& value, std::string* host, int* port) {
  const size_t colon = value.rfind(':');
  int parsed = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(value.substr(colon + 1), &parsed) ||
      parsed < 0 || parsed > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", value, "' must be host:port with a port in [0, 65535] (0 picks a free port)"));
  }
  *host = value.substr(0, colon);
  *port = parsed;
  return absl::OkStatus();
}

absl::Status ValidateOptions(const WorkerOptions& o) {
  if (o.checkpoint.empty()) return absl::InvalidArgumentError("--checkpoint is required (a checkpoint folder)");
  std::string host;
  int port = 0;
  DSV4_RETURN_IF_ERROR(ParseHostPort("--listen", o.listen, &host, &port));
  if (!o.metrics_listen.empty()) DSV4_RETURN_IF_ERROR(ParseHostPort("--metrics-listen", o.metrics_listen, &host, &port));
  if (!o.health_listen.empty()) DSV4_RETURN_IF_ERROR(ParseHostPort("--health-listen", o.health_listen, &host, &port));
  if (o.backend != "cpu" && o.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--backend '", o.backend, "' must be cpu or cuda"));
  }
  if (o.weight_load != "auto" && o.weight_load != "mapped" && o.weight_load != "streamed") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight-load '", o.weight_load, "' must be auto, mapped or streamed"));
  }
  if (o.attention_kernel != "mma" && o.attention_kernel != "simt") {
    return absl::InvalidArgumentError(absl::StrCat("--attention-kernel '", o.attention_kernel, "' must be mma or simt"));
  }
  if (o.backend == "cuda" && o.mem_fraction_set) {
    return absl::InvalidArgumentError(
        "--mem-fraction sizes KV pools in host memory (--backend cpu); with --backend cuda use --gpu-memory-fraction");
  }
  if (!(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-fraction ", o.gpu_memory_fraction, " must lie in (0, 1]"));
  }
  if (o.mode != "exact" && o.mode != "production") {
    return absl::InvalidArgumentError(absl::StrCat("--mode '", o.mode, "' must be exact or production"));
  }
  DSV4_RETURN_IF_ERROR(Range("--device", o.device, 0, 1023));
  DSV4_RETURN_IF_ERROR(Range("--max-batch", o.max_batch, 1, 4096));
  DSV4_RETURN_IF_ERROR(Range("--max-waiting", o.max_waiting, 0, 1 << 20));
  DSV4_RETURN_IF_ERROR(Range("--max-context", o.max_context, 2, 1 << 20));
  DSV4_RETURN_IF_ERROR(Range("--kv-pages", o.kv_pages, 0, int64_t{1} << 31));
  DSV4_RETURN_IF_ERROR(Range("--page-rows", o.page_rows, 1, 4096));
  DSV4_RETURN_IF_ERROR(Range("--prefill-chunk", o.prefill_chunk, 1, 1 << 20));
  DSV4_RETURN_IF_ERROR(Range("--threads", o.threads, 0, 1024));
  DSV4_RETURN_IF_ERROR(Range("--phase-timing-every", o.phase_timing_every, 1, 1 << 20));
  if (o.backend == "cpu" && o.kv_pages == 0 && !(o.mem_fraction > 0 && o.mem_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mem-fraction ", o.mem_fraction, " must lie in (0, 1] when --kv-pages is 0"));
  }
  DSV4_RETURN_IF_ERROR(Range("--world", o.world, 1, 1024));
  DSV4_RETURN_IF_ERROR(Range("--rank", o.rank, 0, o.world - 1));
  if (o.rank > 0) {
    if (o.leader.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--leader is required on rank ", o.rank,
                                                     " (the rank-0 worker's gRPC host:port)"));
    }
    DSV4_RETURN_IF_ERROR(ParseHostPort("--leader", o.leader, &host, &port));
  }
  if (o.host.empty()) return absl::InvalidArgumentError("--host must name this rank's reachable address");
  if (!(o.startup_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--startup-timeout ", o.startup_timeout_s, " must be > 0"));
  }
  if (!(o.comm_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--comm-timeout ", o.comm_timeout_s, " must be > 0"));
  }
  if (!(o.stall_timeout_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--stall-timeout ", o.stall_timeout_s, " must be >= 0 (0 = off)"));
  }
  if (!(o.drain_timeout_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--drain-timeout ", o.drain_timeout_s, " must be >= 0"));
  }
  return absl::OkStatus();
}

std::vector<int> GraphBuckets(const WorkerOptions& o) {
  std::vector<int> buckets;
  if (o.backend != "cuda") return buckets;
  // Dense where decode batches usually are, coarser above: a decode step of n sequences pads to the first bucket
  // >= n, so the waste is at most one step of the ladder; beyond 128, steps of 64 keep the graph count bounded.
  for (int b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128}) {
    if (b < o.max_batch) buckets.push_back(b);
  }
  for (int b = 192; b < o.max_batch; b += 64) buckets.push_back(b);
  buckets.push_back(o.max_batch);
  return buckets;
}

std::string DescribeOptions(const WorkerOptions& o) {
  std::string out = absl::StrCat("backend ", o.backend);
  if (o.backend == "cuda") {
    absl::StrAppend(&out, " (device ", o.device, ", attention ", o.attention_kernel, ", cuda graphs ",
                    o.cuda_graphs ? "on" : "off", ", gpu memory fraction ", o.gpu_memory_fraction, ")");
  } else {
    absl::StrAppend(&out, " (threads ", o.threads, ", mem fraction ", o.mem_fraction, ")");
  }
  absl::StrAppend(&out, ", weight load ", o.weight_load, o.fuse_projections ? "" : ", projections unfused", ", mode ", o.mode, ", group ", o.group, " rank ", o.rank, " of ", o.world, ", max batch ",
                  o.max_batch, ", max context ", o.max_context, ", prefill chunk ", o.prefill_chunk, ", page rows ",
                  o.page_rows, ", kv pages ", o.kv_pages == 0 ? std::string("auto") : absl::StrCat(o.kv_pages),
                  ", listen ", o.listen);
  if (!o.metrics_listen.empty()) absl::StrAppend(&out, ", metrics ", o.metrics_listen);
  return out;
}

ClientTlsOptions LeaderTlsOptions(const WorkerOptions& o) {
  ClientTlsOptions t;
  t.flag_prefix = "--leader-tls-";
  if (o.leader_tls_ca.empty()) return t;  // plaintext
  t.ca_file = o.leader_tls_ca;
  t.cert_file = o.tls.cert_file;
  t.key_file = o.tls.key_file;
  t.server_name = o.leader_tls_server_name;
  return t;
}

}  // namespace dsv4::worker
