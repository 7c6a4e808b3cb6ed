// See group_pool.h: resolution, polling and power-of-two-choices routing over worker groups.
#include "coordinator/group_pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace dsv4::coordinator {

struct GroupPool::Group {
  std::string address;
  std::shared_ptr<dsv4::v1::Worker::Stub> stub;
  bool answered = false;  // the last applied poll answered
  bool stalled = false;   // ... with an engine that made no progress for engine_stall
  std::string why = "not polled yet";
  dsv4::v1::GetLoadResponse load;
  std::optional<dsv4::v1::GetModelInfoResponse> model;
  absl::Time down_since = absl::InfinitePast();
  int64_t inflight = 0;
  int64_t routed_since_poll = 0;  // requests
  int64_t routed_since_poll_tokens = 0;

  bool polling = false;   // a poll of this group is in flight

  bool ready() const { return answered && !stalled && !load.draining() && model.has_value(); }
  const std::string& checkpoint() const {
    static const std::string kUnknown;
    return model.has_value() ? model->checkpoint_fingerprint() : kUnknown;
  }
};

namespace {

// Splits "host:port" / "[v6]:port" into host and port.
absl::Status SplitHostPort(const std::string& entry, std::string* host, int* port) {
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--workers entry '", entry, "' is not host:port"));
  }
  std::string h = entry.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p = 0;
  if (!absl::SimpleAtoi(entry.substr(colon + 1), &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers entry '", entry, "' has port '", entry.substr(colon + 1), "' (need 1..65535)"));
  }
  *host = h;
  *port = p;
  return absl::OkStatus();
}

// Every address `host` resolves to (A and AAAA records), as "ip:port" / "[ip6]:port".
absl::StatusOr<std::vector<std::string>> Resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return absl::UnavailableError(absl::StrCat("resolving '", host, "': ", gai_strerror(rc)));
  std::vector<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      out.push_back(absl::StrCat(buf, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf, sizeof(buf));
      out.push_back(absl::StrCat("[", buf, "]:", port));
    }
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::shared_ptr<dsv4::v1::Worker::Stub> MakeStub(const std::string& address, const ChannelSecurity& security,
                                                  const std::string& verify_as) {
  grpc::ChannelArguments args;
  // A restarted or rescheduled leader should be found within a poll or two, not after gRPC's default
  // exponential backoff (up to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Detect a leader whose host vanished (no RST) on long streams.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto channel = security.Connect(address, args, verify_as);
  return std::shared_ptr<dsv4::v1::Worker::Stub>(dsv4::v1::Worker::NewStub(channel));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseWorkerList(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    std::string entry(absl::StripAsciiWhitespace(part));
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(entry, &host, &port); !s.ok()) return s;
    out.push_back(entry);
  }
  if (out.empty()) return absl::InvalidArgumentError("--workers is empty (need host:port[,host:port...])");
  return out;
}

GroupPool::GroupPool(GroupPoolOptions options) : options_(std::move(options)), rng_(options_.seed) {}

GroupPool::~GroupPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  // Polls still in flight call back into this pool: wait for them (each ends by the health deadline); then the
  // polls, groups and stubs go on this thread.
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return polls_in_flight_ == 0; };
  mu_.Await(absl::Condition(&all_done));
  polls_.clear();
}

absl::Status GroupPool::Start() {
  for (const std::string& t : options_.targets) {
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(t, &host, &port); !s.ok()) return s;
  }
  if (options_.targets.empty()) return absl::InvalidArgumentError("no worker targets");
  PollOnce(/*wait=*/true);
  watcher_ = std::thread([this] { WatchLoop(); });
  return absl::OkStatus();
}

std::vector<std::string> GroupPool::ResolveTargets() {
  std::vector<std::string> all;
  for (const std::string& t : options_.targets) {
    std::string host;
    int port = 0;
    (void)SplitHostPort(t, &host, &port);  // validated by Start
    absl::StatusOr<std::vector<std::string>> r = Resolve(host, port);
    if (!r.ok()) {
      // Keep whatever groups this target had: a DNS hiccup must not drop live groups.
      DSV4_LOG_WARN("coordinator: {}", std::string(r.status().message()));
      absl::MutexLock lock(&mu_);
      for (const auto& g : groups_) all.push_back(g->address);
      continue;
    }
    all.insert(all.end(), r->begin(), r->end());
    absl::MutexLock lock(&mu_);
    for (const std::string& a : *r) host_of_[a] = host;
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

void GroupPool::WatchLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.poll_interval)) return;
    }
    PollOnce(/*wait=*/false);
  }
}

// One poll of one group: its RPCs' answers. The last RPC to end applies it (FinishPoll), so each group's poll ends
// on its own: a group that hangs until the health deadline does not hold up the others' polls. The pool
// owns it and frees it on the watcher thread (or in the destructor): its ClientContexts hold the channel, and a
// channel must never be destroyed on a gRPC callback thread (that can join the thread itself: grpc/grpc#37858).
// Each RPC is a ClientUnaryReactor rather than a callback: gRPC drops its own reference to the call before
// OnDone, whereas a plain callback's call is unreferenced after it returns - by then the watcher may have freed
// the poll, and the callback thread would let go of the channel's last reference.
struct GroupPool::Poll {
  class Rpc final : public grpc::ClientUnaryReactor {
   public:
    Rpc(Poll* poll, grpc::Status* status) : poll_(poll), status_(status) {}
    void OnDone(const grpc::Status& s) override {
      *status_ = s;
      if (--poll_->pending == 0) poll_->pool->FinishPoll(*poll_);
    }

   private:
    Poll* poll_;
    grpc::Status* status_;
  };

  GroupPool* pool = nullptr;
  std::shared_ptr<Group> group;
  absl::Time started;
  grpc::ClientContext load_ctx, info_ctx;
  dsv4::v1::GetLoadRequest load_req;
  dsv4::v1::GetModelInfoRequest info_req;
  dsv4::v1::GetLoadResponse load;
  dsv4::v1::GetModelInfoResponse info;
  grpc::Status load_status, info_status;
  Rpc load_rpc{this, &load_status}, info_rpc{this, &info_status};
  std::atomic<int> pending{2};
  bool done = false;  // guarded by the pool's mu_: both RPCs are finished with it
};

void GroupPool::PollOnce(bool wait) {
  const std::vector<std::string> addresses = ResolveTargets();
  std::vector<Poll*> started_polls;
  {
    absl::MutexLock lock(&mu_);
    // Finished polls go here, on the watcher thread (see Poll).
    std::erase_if(polls_, [](const std::unique_ptr<Poll>& p) { return p->done; });
    // Groups that vanished from DNS are dropped (an unfinished poll keeps its own reference until it is freed
    // above). Their stubs wait in stubs_to_drop_ until the in-flight streams that share them have let go, so this
    // thread, not a stream's callback, releases the last reference to the channel.
    std::erase_if(stubs_to_drop_, [](const auto& stub) { return stub.use_count() == 1; });
    std::erase_if(groups_, [&](const std::shared_ptr<Group>& g) {
      const bool gone = !std::binary_search(addresses.begin(), addresses.end(), g->address);
      if (gone) stubs_to_drop_.push_back(g->stub);
      return gone;
    });
    for (const std::string& a : addresses) {
      auto it = std::find_if(groups_.begin(), groups_.end(), [&](const auto& g) { return g->address == a; });
      if (it != groups_.end()) continue;
      auto g = std::make_shared<Group>();
      g->address = a;
      g->stub = MakeStub(a, options_.security, host_of_[a]);
      DSV4_LOG_INFO("coordinator: watching worker group {}", a);
      groups_.push_back(std::move(g));
    }
    for (const auto& g : groups_) {
      if (g->polling) continue;  // its last poll is still waiting for an answer (at most the health deadline)
      g->polling = true;
      auto p = std::make_unique<Poll>();
      p->pool = this;
      p->group = g;
      started_polls.push_back(p.get());
      polls_.push_back(std::move(p));
    }
    polls_in_flight_ += static_cast<int>(started_polls.size());
  }
  const absl::Time started = absl::Now();
  const auto deadline = absl::ToChronoTime(started + options_.rpc_timeout);
  for (Poll* p : started_polls) {
    p->started = started;
    // GetModelInfo every time, not once: a leader restarted at the same address may serve another checkpoint.
    p->load_ctx.set_deadline(deadline);
    p->group->stub->async()->GetLoad(&p->load_ctx, &p->load_req, &p->load, &p->load_rpc);
    p->info_ctx.set_deadline(deadline);
    p->group->stub->async()->GetModelInfo(&p->info_ctx, &p->info_req, &p->info, &p->info_rpc);
    p->load_rpc.StartCall();
    p->info_rpc.StartCall();
  }
  if (wait) {
    absl::MutexLock lock(&mu_);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return polls_in_flight_ == 0; };
    mu_.Await(absl::Condition(&all_done));
  }
}

// On a gRPC callback thread, once both of a poll's RPCs have ended.
void GroupPool::FinishPoll(Poll& p) {
  std::optional<std::string> why_failed;
  const std::string address = p.group->address;
  {
    absl::MutexLock lock(&mu_);
    ApplyPollLocked(p, p.started);
    if (p.group->stalled) {
      why_failed = p.group->why;
    } else if (!p.load_status.ok()) {
      why_failed = p.load_status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                       ? absl::StrCat("no GetLoad answer within the health deadline (",
                                      absl::ToInt64Milliseconds(options_.rpc_timeout), " ms)")
                       : absl::StrCat("GetLoad failed: ", p.load_status.error_message());
    }
    p.group->polling = false;
  }
  if (why_failed && options_.on_unanswered) options_.on_unanswered(address, *why_failed);
  absl::MutexLock lock(&mu_);
  p.done = true;       // from here the watcher may free it
  --polls_in_flight_;  // last: the pool (and what on_unanswered reaches) outlives every callback
}

void GroupPool::ApplyPollLocked(const Poll& p, absl::Time started) {
  Group& g = *p.group;
  if (started <= g.down_since) return;  // this poll may predate the failure that marked the group down
  const bool was_ready = g.ready();
  g.answered = p.load_status.ok();
  if (p.info_status.ok()) {
    g.model = p.info;
  } else if (!g.answered) {
    g.model.reset();  // what answers at this address next may be another process on another checkpoint
  }
  if (g.answered) {
    g.load = p.load;
    g.routed_since_poll = 0;
    g.routed_since_poll_tokens = 0;
  }
  g.stalled = g.answered && options_.engine_stall > absl::ZeroDuration() &&
              absl::Seconds(g.load.seconds_since_progress()) >= options_.engine_stall;
  if (!g.answered) {
    g.why = absl::StrCat("GetLoad: ", p.load_status.error_message());
  } else if (g.stalled) {
    g.why = absl::StrFormat("engine made no progress for %.1f s with %d running and %d waiting (engine stall "
                            "deadline %d ms)",
                            g.load.seconds_since_progress(), g.load.running(), g.load.waiting(),
                            absl::ToInt64Milliseconds(options_.engine_stall));
  } else if (!g.model.has_value()) {
    g.why = absl::StrCat("GetModelInfo: ", p.info_status.error_message());
  } else if (g.load.draining()) {
    g.why = "draining";
  } else {
    g.why.clear();
  }
  if (was_ready == g.ready()) return;
  if (g.ready()) {
    DSV4_LOG_INFO("coordinator: group {} is ready", g.address);
  } else {
    DSV4_LOG_WARN("coordinator: group {} is not ready: {}", g.address, g.why);
  }
}

double GroupPool::Score(const Group& g) const {
  const double tokens = static_cast<double>(g.load.running_tokens() + g.load.waiting_tokens() +
                                            g.routed_since_poll_tokens);
  return tokens * (1.0 + std::clamp(g.load.kv_usage_ratio(), 0.0, 1.0));
}

bool GroupPool::Saturated(const Group& g) const {
  if (g.load.max_waiting() <= 0) return false;  // the group does not bound its queue
  const int64_t free_slots = std::max<int64_t>(0, g.load.max_batch() - g.load.running());
  const int64_t est_waiting = g.load.waiting() + std::max<int64_t>(0, g.routed_since_poll - free_slots);
  return est_waiting >= g.load.max_waiting();
}

absl::StatusOr<GroupHandle> GroupPool::Pick(int64_t tokens, const absl::flat_hash_set<std::string>& exclude,
                                            const std::optional<std::string>& checkpoint) {
  absl::MutexLock lock(&mu_);
  // ready: every ready group (of the checkpoint asked for), those this request already tried included (a group
  // that refused it with a full queue stays ready), so the messages below count what an operator sees; open:
  // where it may go now.
  std::vector<Group*> ready, open;
  int tried = 0, other_checkpoint = 0;
  for (auto& g : groups_) {
    if (!g->ready()) continue;
    if (checkpoint.has_value() && g->checkpoint() != *checkpoint) {
      ++other_checkpoint;
      continue;
    }
    ready.push_back(g.get());
    if (exclude.contains(g->address)) {
      ++tried;
    } else if (!Saturated(*g)) {
      open.push_back(g.get());
    }
  }
  if (ready.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "no worker group is ready (", groups_.size(), " known, ", exclude.size(), " already failed for this request",
        other_checkpoint > 0 ? absl::StrCat(", ", other_checkpoint, " ready but serving another checkpoint than '",
                                            checkpoint.value_or(""), "', which began this stream")
                             : "",
        ")", NotReadySummaryLocked()));
  }
  if (open.empty()) {
    double step = 0;
    for (const Group* g : ready) step = std::max(step, g->load.recent_step_seconds());
    const int64_t hint_ms = std::clamp<int64_t>(static_cast<int64_t>(step * 1000.0), 50, 5000);
    absl::Status busy = absl::ResourceExhaustedError(absl::StrCat(
        "all ", ready.size(), " ready worker groups are saturated",
        tried > 0 ? absl::StrCat(" (", tried, " of them already tried for this request)") : "", "; retry after ",
        hint_ms, " ms"));
    busy.SetPayload(kRetryAfterMsPayload, absl::Cord(absl::StrCat(hint_ms)));
    return busy;
  }
  Group* chosen = open[0];
  if (open.size() > 1) {
    std::uniform_int_distribution<size_t> pick(0, open.size() - 1);
    const size_t a = pick(rng_);
    size_t b = pick(rng_);
    while (b == a) b = pick(rng_);
    chosen = Score(*open[b]) < Score(*open[a]) ? open[b] : open[a];
  }
  chosen->inflight += 1;
  chosen->routed_since_poll += 1;
  chosen->routed_since_poll_tokens += tokens;
  return GroupHandle{.address = chosen->address, .stub = chosen->stub, .tokens = tokens,
                     .checkpoint = chosen->checkpoint()};
}

void GroupPool::Release(const GroupHandle& group) {
  absl::MutexLock lock(&mu_);
  for (auto& g : groups_) {
    if (g->address != group.address) continue;
    g->inflight = std::max<int64_t>(0, g->inflight - 1);
  }
}

void GroupPool::MarkDown(const std::string& address, const std::string& why) {
  absl::MutexLock lock(&mu_);
  for (auto& g : groups_) {
    if (g->address != address) continue;
    if (g->ready()) DSV4_LOG_WARN("coordinator: group {} marked down: {}", address, why);
    g->answered = false;
    g->why = why;
    g->down_since = absl::Now();
  }
}

std::optional<dsv4::v1::GetModelInfoResponse> GroupPool::ModelInfo() const {
  absl::MutexLock lock(&mu_);
  // The checkpoint most ready groups serve (ties: the smallest fingerprint, so the answer is stable); the answer's
  // fields come from a ready group on it, the limits are the minimum over every group that answered.
  absl::flat_hash_map<std::string, int> count;
  int ready = 0;
  for (const auto& g : groups_) {
    if (!g->ready()) continue;
    ++ready;
    ++count[g->checkpoint()];
  }
  std::pair<int, std::string> best{0, ""};
  for (const auto& [fingerprint, n] : count) {
    if (n > best.first || (n == best.first && fingerprint < best.second)) best = {n, fingerprint};
  }
  const Group* source = nullptr;
  for (const auto& g : groups_) {
    if (!g->model.has_value()) continue;
    const bool preferred = g->ready() && g->checkpoint() == best.second;
    if (source == nullptr || (preferred && !(source->ready() && source->checkpoint() == best.second))) {
      source = g.get();
    }
  }
  if (source == nullptr) return std::nullopt;
  dsv4::v1::GetModelInfoResponse out = *source->model;
  for (const auto& g : groups_) {
    if (!g->model.has_value()) continue;
    out.set_vocab_size(std::min(out.vocab_size(), g->model->vocab_size()));
    out.set_max_context(std::min(out.max_context(), g->model->max_context()));
  }
  out.set_ready_groups(ready);
  out.set_total_groups(static_cast<int>(groups_.size()));
  return out;
}

std::string GroupPool::NotReadySummary() const {
  absl::MutexLock lock(&mu_);
  return NotReadySummaryLocked();
}

std::string GroupPool::NotReadySummaryLocked() const {
  // Counts by kind only: the message goes to gateway clients, which have no business with worker addresses or
  // transport errors (the coordinator's log names each group and why when it stops being ready).
  absl::flat_hash_map<std::string, int> kinds;
  for (const auto& g : groups_) {
    if (g->ready()) continue;
    std::string kind = "not ready";
    if (!g->answered) {
      kind = g->why.rfind("GetLoad", 0) == 0 || g->why == "not polled yet" ? "not answering its health poll"
                                                                         : "down after a failed stream";
    } else if (g->stalled) {
      kind = "engine stalled";
    } else if (g->load.draining()) {
      kind = "draining";
    } else if (!g->model.has_value()) {
      kind = "model unknown";
    }
    ++kinds[kind];
  }
  std::vector<std::string> parts;
  for (const auto& [kind, n] : kinds) parts.push_back(absl::StrCat(n, " ", kind));
  std::sort(parts.begin(), parts.end());
  return parts.empty() ? "" : absl::StrCat(": ", absl::StrJoin(parts, ", "));
}

int GroupPool::ReadyCheckpoints() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> seen;
  for (const auto& g : groups_) {
    if (g->ready()) seen.insert(g->checkpoint());
  }
  return static_cast<int>(seen.size());
}

std::vector<GroupStatus> GroupPool::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupStatus> out;
  for (const auto& g : groups_) {
    out.push_back(GroupStatus{.address = g->address,
                              .ready = g->ready(),
                              .why_not_ready = g->why,
                              .load = g->load,
                              .inflight = g->inflight,
                              .routed_since_poll_tokens = g->routed_since_poll_tokens});
  }
  return out;
}

int GroupPool::ReadyCount() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(groups_.begin(), groups_.end(), [](const auto& g) { return g->ready(); }));
}

bool GroupPool::WaitForReady(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::count_if(groups_.begin(), groups_.end(), [](const auto& g) { return g->ready(); }) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

}  // namespace dsv4::coordinator
