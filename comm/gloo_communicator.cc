// GlooCommunicator: see gloo_communicator.h.
#include "comm/gloo_communicator.h"

#include <csignal>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/tcp_store.h"
#include "common/float_formats.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace dsv4::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Every rank announces itself, then waits for all; on timeout the error lists exactly who is missing, which
// connectFullMesh's own timeout ("waiting for key 2") would not say clearly.
absl::Status WaitForAllRanks(TcpStoreClient& store, int rank, int world, std::chrono::milliseconds timeout,
                             const std::string& store_addr) {
  try {
    store.set(absl::StrCat("arrive/", rank), {'1'});
    const auto deadline = Clock::now() + timeout;
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) missing.push_back(r);
    while (true) {
      std::vector<int> still;
      for (int r : missing) {
        try {
          store.wait({absl::StrCat("arrive/", r)}, std::chrono::milliseconds(0));
        } catch (const gloo::IoException&) {
          still.push_back(r);
        }
      }
      missing.swap(still);
      if (missing.empty()) return absl::OkStatus();
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank, " of world ", world, ": rank(s) ", absl::StrJoin(missing, ", "),
            " never arrived at the rendezvous store ", store_addr, " within ", timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, ": rendezvous store ", store_addr, " failed: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(int rank, int world,
                                                                           const GlooOptions& options) {
  DSV4_RETURN_IF_ERROR(ValidateRankWorld(rank, world));
  if (options.comm.timeout.count() <= 0 || options.comm.startup_timeout.count() <= 0) {
    return absl::InvalidArgumentError("gloo: timeout and startup_timeout must be positive");
  }
  if (options.bind_host.empty()) return absl::InvalidArgumentError("gloo: bind_host is empty");
  std::signal(SIGPIPE, SIG_IGN);
  DSV4_ASSIGN_OR_RETURN(auto store, TcpStoreClient::Connect(options.store_addr, options.comm.startup_timeout));
  DSV4_RETURN_IF_ERROR(WaitForAllRanks(*store, rank, world, options.comm.startup_timeout, options.store_addr));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    context->setTimeout(options.comm.startup_timeout);
    gloo::rendezvous::PrefixStore mesh_store("mesh", *store);
    context->connectFullMesh(mesh_store, device);
    context->setTimeout(options.comm.timeout);
    DSV4_LOG_INFO("gloo: rank {} of {} connected ({} via {})", rank, world, options.bind_host, options.store_addr);
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(rank, world, options.comm, std::move(device), std::move(context)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, " of world ", world,
                                               ": gloo could not connect the group: ", e.what()));
  }
}

GlooCommunicator::GlooCommunicator(int rank, int world, CommOptions options,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<gloo::Context> context)
    : rank_(rank), world_(world), options_(options), device_(std::move(device)), context_(std::move(context)) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::Status GlooCommunicator::Fail(const std::string& op, const std::string& what) {
  if (broken_.ok()) {
    broken_ = absl::UnavailableError(absl::StrCat("gloo ", op, " failed on rank ", rank_, " of world ", world_,
                                                  ": ", what, " (the worker group must be re-formed)"));
    DSV4_LOG_ERROR("{}", broken_.ToString());
  }
  // Dropping the context closes every socket, so peers blocked on us fail now rather than at their deadline.
  context_.reset();
  device_.reset();
  return broken_;
}

absl::Status GlooCommunicator::AllReduceF32(float* data, size_t n, const std::string& op) {
  if (!broken_.ok()) return broken_;
  if (n == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": null data with n > 0"));
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTimeout(options_.timeout);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return Fail(op, e.what());
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t n) { return AllReduceF32(data, n, "AllReduceSum"); }

absl::Status GlooCommunicator::AllReduceSumBf16(uint16_t* data, size_t n) {
  if (!broken_.ok()) return broken_;
  if (n == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("AllReduceSumBf16: null data with n > 0");
  scratch_.resize(n);
  for (size_t i = 0; i < n; ++i) scratch_[i] = Bf16ToF32(data[i]);
  DSV4_RETURN_IF_ERROR(AllReduceF32(scratch_.data(), n, "AllReduceSumBf16"));
  for (size_t i = 0; i < n; ++i) data[i] = F32ToBf16(scratch_[i]);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const void* send, void* recv, size_t bytes_per_rank) {
  if (!broken_.ok()) return broken_;
  if (bytes_per_rank == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) return absl::InvalidArgumentError("AllGather: null buffer");
  try {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes_per_rank);
    opts.setOutput(static_cast<uint8_t*>(recv), bytes_per_rank * static_cast<size_t>(world_));
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return Fail("AllGather", e.what());
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (!broken_.ok()) return broken_;
  if (root < 0 || root >= world_) {
    return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " outside world ", world_));
  }
  if (bytes == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("Broadcast: null data with bytes > 0");
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return Fail("Broadcast", e.what());
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Barrier() {
  if (!broken_.ok()) return broken_;
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    return Fail("Barrier", e.what());
  }
  return absl::OkStatus();
}

}  // namespace dsv4::comm
