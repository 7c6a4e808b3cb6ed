// Leader/follower rendezvous: see rendezvous.h.
#include "comm/rendezvous.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/gloo_communicator.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

#if defined(DSV4_HAVE_NCCL)
#include "comm/nccl_communicator.h"
#endif

namespace dsv4::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxRefusalsKept = 8;

absl::Status ValidateGroupOptions(const GroupOptions& o) {
  DSV4_RETURN_IF_ERROR(ValidateRankWorld(o.rank, o.world));
  if (o.world > 1 && o.host.empty()) return absl::InvalidArgumentError("group: host (this rank's address) is empty");
  if (o.rank > 0 && o.leader_addr.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("group: rank ", o.rank, " needs the leader's address"));
  }
  if (o.comm.timeout.count() <= 0 || o.comm.startup_timeout.count() <= 0) {
    return absl::InvalidArgumentError("group: timeout and startup_timeout must be positive");
  }
#if !defined(DSV4_HAVE_NCCL)
  if (o.use_nccl) return absl::FailedPreconditionError("group: NCCL requested but this build has no CUDA");
#endif
  return absl::OkStatus();
}

// Joins the communicators once the rendezvous is done. store_addr / nccl_id come from the leader.
absl::StatusOr<Group> JoinCommunicators(const GroupOptions& o, const std::string& store_addr,
                                        const std::string& nccl_id, Clock::time_point deadline) {
  Group group;
  if (o.world == 1) {
    group.control = std::make_unique<LocalCommunicator>();
  } else {
    GlooOptions g;
    g.comm = o.comm;
    g.comm.startup_timeout = std::max(std::chrono::milliseconds(1),
                                      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    g.store_addr = store_addr;
    g.bind_host = o.host;
    DSV4_ASSIGN_OR_RETURN(group.control, GlooCommunicator::Create(o.rank, o.world, g));
  }
#if defined(DSV4_HAVE_NCCL)
  if (o.use_nccl) {
    NcclOptions n;
    n.comm = o.comm;
    n.device = o.cuda_device;
    DSV4_ASSIGN_OR_RETURN(group.nccl, NcclCommunicator::Create(o.rank, o.world, nccl_id, n));
  }
#endif
  return group;
}

}  // namespace

// ---------------------------------------------------------------- leader

absl::StatusOr<std::unique_ptr<RendezvousLeader>> RendezvousLeader::Create(const GroupOptions& options) {
  DSV4_RETURN_IF_ERROR(ValidateGroupOptions(options));
  if (options.rank != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RendezvousLeader runs on rank 0, not rank ", options.rank));
  }
  auto leader = std::unique_ptr<RendezvousLeader>(new RendezvousLeader(options));
  if (options.world > 1) {
    DSV4_ASSIGN_OR_RETURN(leader->store_, TcpStoreServer::Start(options.host, options.store_port));
  }
#if defined(DSV4_HAVE_NCCL)
  if (options.use_nccl) {
    DSV4_ASSIGN_OR_RETURN(leader->nccl_id_, NcclCommunicator::NewUniqueId());
  }
#endif
  return leader;
}

std::string RendezvousLeader::store_address() const { return store_ != nullptr ? store_->Address() : ""; }

absl::Status RendezvousLeader::Refuse(int rank, const std::string& why) {
  const std::string msg = absl::StrCat("rendezvous refused rank ", rank, ": ", why);
  DSV4_LOG_WARN("{}", msg);
  std::lock_guard<std::mutex> lock(mu_);
  refusals_.push_back(msg);
  if (refusals_.size() > kMaxRefusalsKept) refusals_.erase(refusals_.begin());
  return absl::FailedPreconditionError(msg);
}

absl::Status RendezvousLeader::Handle(const dsv4::v1::RendezvousRequest& request,
                                      dsv4::v1::RendezvousResponse* response) {
  const int rank = request.rank();
  if (formed_.load()) {
    return Refuse(rank, "the group is already formed (restart the whole group to replace a rank)");
  }
  if (request.world() != options_.world) {
    return Refuse(rank, absl::StrCat("world mismatch: the follower was started with world ", request.world(),
                                     ", the leader runs world ", options_.world));
  }
  if (rank < 1 || rank >= options_.world) {
    return Refuse(rank, absl::StrCat("rank out of range: followers are ranks 1..", options_.world - 1));
  }
  if (request.checkpoint_fingerprint() != options_.checkpoint_fingerprint) {
    return Refuse(rank, absl::StrCat("checkpoint mismatch: the follower loaded '", request.checkpoint_fingerprint(),
                                     "', the leader '", options_.checkpoint_fingerprint, "'"));
  }
  if (request.host().empty()) return Refuse(rank, "the follower sent no host address");
  std::string taken_by;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = joined_.find(rank);
    if (it != joined_.end() && it->second != request.host()) {
      taken_by = it->second;
    } else {
      joined_[rank] = request.host();
    }
  }
  if (!taken_by.empty()) {
    return Refuse(rank, absl::StrCat("rank already taken by host ", taken_by, " (this request from ", request.host(),
                                     ")"));
  }
  cv_.notify_all();
  response->set_gloo_store_addr(store_address());
  response->set_nccl_unique_id(nccl_id_);
  response->set_world(options_.world);
  DSV4_LOG_INFO("rendezvous: rank {} joined from {}", rank, request.host());
  return absl::OkStatus();
}

absl::StatusOr<Group> RendezvousLeader::FormGroup() {
  const auto deadline = Clock::now() + options_.comm.startup_timeout;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const bool all = cv_.wait_until(lock, deadline, [&] { return static_cast<int>(joined_.size()) == options_.world - 1; });
    if (!all) {
      std::vector<int> missing;
      for (int r = 1; r < options_.world; ++r) {
        if (!joined_.contains(r)) missing.push_back(r);
      }
      std::string msg = absl::StrCat("leader: follower rank(s) ", absl::StrJoin(missing, ", "),
                                     " never completed the rendezvous within ",
                                     options_.comm.startup_timeout.count(), " ms");
      if (!refusals_.empty()) absl::StrAppend(&msg, "; refused meanwhile: ", absl::StrJoin(refusals_, "; "));
      return absl::DeadlineExceededError(msg);
    }
  }
  formed_ = true;
  return JoinCommunicators(options_, store_address(), nccl_id_, deadline);
}

// ---------------------------------------------------------------- follower

absl::StatusOr<dsv4::v1::RendezvousResponse> CallRendezvous(const GroupOptions& options) {
  DSV4_RETURN_IF_ERROR(ValidateGroupOptions(options));
  if (options.rank == 0) return absl::InvalidArgumentError("CallRendezvous is for followers (rank >= 1)");
  auto channel = options.leader_security.Connect(options.leader_addr);
  auto stub = dsv4::v1::Worker::NewStub(channel);
  dsv4::v1::RendezvousRequest request;
  request.set_rank(options.rank);
  request.set_world(options.world);
  request.set_checkpoint_fingerprint(options.checkpoint_fingerprint);
  request.set_host(options.host);
  const auto deadline = Clock::now() + options.comm.startup_timeout;
  absl::Status last;
  while (true) {
    grpc::ClientContext ctx;
    // Each attempt gets a short deadline so a leader that accepts connections but stalls is retried too.
    const auto attempt = std::min<Clock::duration>(deadline - Clock::now(), std::chrono::seconds(5));
    ctx.set_deadline(std::chrono::system_clock::now() + attempt);
    dsv4::v1::RendezvousResponse response;
    last = FromGrpcStatus(stub->Rendezvous(&ctx, request, &response));
    if (last.ok()) {
      if (response.world() != options.world) {
        return absl::FailedPreconditionError(absl::StrCat("leader at ", options.leader_addr, " answered world ",
                                                          response.world(), ", expected ", options.world));
      }
      return response;
    }
    // Not up yet (UNAVAILABLE) or slow (DEADLINE_EXCEEDED): retry. Anything else is the leader's answer.
    if (last.code() != absl::StatusCode::kUnavailable && last.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(last.code(), absl::StrCat("leader at ", options.leader_addr, " refused rank ",
                                                    options.rank, ": ", last.message()));
    }
    if (Clock::now() + options.retry_interval >= deadline) break;
    std::this_thread::sleep_for(options.retry_interval);
  }
  return absl::DeadlineExceededError(absl::StrCat("rank ", options.rank, " could not rendezvous with the leader at ",
                                                  options.leader_addr, " within ",
                                                  options.comm.startup_timeout.count(), " ms (last error: ",
                                                  last.ToString(), ")"));
}

absl::StatusOr<Group> JoinGroup(const GroupOptions& options) {
  const auto deadline = Clock::now() + options.comm.startup_timeout;
  DSV4_ASSIGN_OR_RETURN(auto response, CallRendezvous(options));
  if (options.use_nccl && response.nccl_unique_id().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options.rank, " wants NCCL but the leader at ", options.leader_addr, " runs a CPU group"));
  }
  return JoinCommunicators(options, response.gloo_store_addr(), response.nccl_unique_id(), deadline);
}

// ---------------------------------------------------------------- fingerprint

absl::StatusOr<std::string> CheckpointFingerprint(const std::string& dir) {
  constexpr size_t kDataSample = 4096;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return absl::NotFoundError(absl::StrCat("checkpoint folder ", dir, " not found"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == "hf_quant_config.json" || n == "model.safetensors.index.json" ||
        (n.size() > 12 && n.ends_with(".safetensors"))) {
      names.push_back(n);
    }
  }
  std::sort(names.begin(), names.end());
  if (std::find(names.begin(), names.end(), "config.json") == names.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint folder ", dir, " has no config.json"));
  }
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
  };
  for (const auto& n : names) {
    std::ifstream f(fs::path(dir) / n, std::ios::binary);
    if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", dir, "/", n));
    std::string bytes;
    if (n.ends_with(".safetensors")) {
      // 8-byte little-endian header length, then the JSON header: names, dtypes, shapes, offsets.
      unsigned char len_bytes[8] = {};
      f.read(reinterpret_cast<char*>(len_bytes), 8);
      uint64_t len = 0;
      for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
      if (!f || len > 100'000'000) return absl::DataLossError(absl::StrCat(dir, "/", n, ": bad safetensors header"));
      bytes.resize(len);
      f.read(bytes.data(), static_cast<std::streamsize>(len));
      if (!f) return absl::DataLossError(absl::StrCat(dir, "/", n, ": truncated safetensors header"));
      // Plus the first kDataSample bytes of tensor data: two checkpoints of one shape (another seed, another
      // fine-tune) have identical headers, and a few KiB per file keeps this in milliseconds.
      std::string sample(kDataSample, '\0');
      f.read(sample.data(), static_cast<std::streamsize>(kDataSample));
      sample.resize(static_cast<size_t>(f.gcount()));
      bytes += sample;
    } else {
      bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    mix(n.data(), n.size() + 1);  // the name and its terminating NUL separate records
    mix(bytes.data(), bytes.size());
  }
  return absl::StrFormat("fnv1a64:%016x", h);
}

}  // namespace dsv4::comm
