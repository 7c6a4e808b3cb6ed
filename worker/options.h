// The worker process's typed options: defaults written here, filled from absl flags in main.cc, checked by
// ValidateOptions before anything is loaded (a bad flag ends start-up with one line naming it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tls_options.h"

namespace dsv4::worker {

struct WorkerOptions {
  std::string checkpoint;                  // --checkpoint: Hugging Face-style folder (required)
  std::string listen = "127.0.0.1:0";      // --listen: gRPC host:port (port 0 picks one)
  std::string backend = "cpu";             // --backend: cpu | cuda
  int device = 0;                          // --device: GPU ordinal (cuda)
  std::string attention_kernel = "mma";    // --attention-kernel: cuda sparse-MLA decode kernel, mma | simt
  std::string weight_load = "auto";        // --weight-load: auto | mapped | streamed (model/dsv4/weights.h)
  bool fuse_projections = true;            // --fuse-projections: the projections of one input as one launch
                                           // (ModelOptions::fuse_projections; false: one linear each)
  bool cuda_graphs = true;                 // --cuda-graphs: decode steps replay per-bucket CUDA graphs (cuda);
                                           // false: the same padded steps, launched eagerly
  double gpu_memory_fraction = 0.9;        // --gpu-memory-fraction: share of the GPU's memory this worker uses
  int max_batch = 32;                      // --max-batch: running requests at most
  int max_waiting = 256;                   // --max-waiting: queued requests before RESOURCE_EXHAUSTED
  int max_context = 4096;                  // --max-context: prompt + generated tokens per request
  int64_t kv_pages = 0;                    // --kv-pages: pages per KV pool; 0 = size from --mem-fraction
  double mem_fraction = 0.3;               // --mem-fraction: share of MemAvailable for KV pools (cpu)
  bool mem_fraction_set = false;           // whether --mem-fraction was given (refused with --backend cuda)
  int page_rows = 64;                      // --page-rows: rows per KV page
  int prefill_chunk = 256;                 // --prefill-chunk: prefill tokens per step (all requests)
  std::string mode = "exact";              // --mode: exact | production (model NumericMode)
  int threads = 0;                         // --threads: CPU threads in the model; 0 = all cores
  std::string group = "0";                 // --group: worker group (replica) id, used in metric labels
  int rank = 0;                            // --rank
  int world = 1;                           // --world: ranks in the group (tensor parallel; divides heads, experts)
  std::string host = "127.0.0.1";          // --host: this rank's address the other ranks reach (Gloo, store)
  std::string leader;                      // --leader: rank 0's gRPC host:port (required on ranks >= 1)
  double startup_timeout_s = 60;           // --startup-timeout: every rank must join the group within this
  double comm_timeout_s = 30;              // --comm-timeout: deadline of one collective (a hung rank's detection)
  std::string metrics_listen;              // --metrics-listen: host:port for /metrics; empty = off
  std::string ready_file;                  // --ready-file: "grpc=HOST:PORT metrics=HOST:PORT" once SERVING
  double drain_timeout_s = 30;             // --drain-timeout: SIGTERM drain budget, seconds
  double stall_timeout_s = 120;            // --stall-timeout: health NOT_SERVING after this long without a step
                                           // while there is work (a hung engine); 0 = off
  std::string log_level = "info";          // --log-level
  int phase_timing_every = 64;             // --phase-timing-every: time the phases of 1 step in N (needs metrics)
  bool validate_only = false;              // --validate-only: check the flags, print them, exit 0 (CI, deploy/)
  // Security (docs/security.md); all empty = plaintext. The certificate is also the client certificate a
  // follower rank presents to its leader.
  ServerTlsOptions tls{};                  // --tls-cert, --tls-key, --tls-client-ca (mutual TLS)
  std::string leader_tls_ca;               // --leader-tls-ca: followers verify the leader against it (TLS on)
  std::string leader_tls_server_name;      // --leader-tls-server-name: empty = the host part of --leader
  std::string health_listen;               // --health-listen: plaintext Health/Check-only port; empty = none
};

// INVALID_ARGUMENT naming the flag and the allowed range. Checks the flags alone (never the checkpoint folder,
// the GPU or what this build contains): what `--validate-only` runs, so a manifest checked in CI on a CPU-only
// machine passes exactly when the flags are right.
absl::Status ValidateOptions(const WorkerOptions& options);

// The CUDA-graph decode buckets for --max-batch (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, then steps of
// 64), the last one exactly max_batch; empty for --backend cpu. Decode steps are padded to them with
// --cuda-graphs=false too (then run eagerly), so turning graphs off changes nothing but the launches.
std::vector<int> GraphBuckets(const WorkerOptions& options);

// One line naming the options that matter for a deployment (printed by --validate-only and at start-up).
std::string DescribeOptions(const WorkerOptions& options);

// The largest step the engine runs: a full prefill chunk plus one decode token of every other running request.
inline int64_t MaxStepTokens(const WorkerOptions& o) { return int64_t{o.prefill_chunk} + o.max_batch; }

// "host:port" split; INVALID_ARGUMENT naming `flag` when malformed.
absl::Status ParseHostPort(const std::string& flag, const std::string& value, std::string* host, int* port);

// How a follower rank dials its leader: TLS when --leader-tls-ca is set (presenting --tls-cert as its client
// certificate when set), plaintext otherwise.
ClientTlsOptions LeaderTlsOptions(const WorkerOptions& options);

}  // namespace dsv4::worker
