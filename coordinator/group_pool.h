// GroupPool: the coordinator's view of its worker groups (one entry per group leader), with load-aware
// choice of the group for each request.
//
// --workers is a comma-separated list of "host:port" entries; each entry may resolve to several addresses
// (a Kubernetes headless service resolves to every leader pod), and each resolved address is one group. A
// watcher thread re-resolves the list and polls every group with Worker.GetLoad (and Worker.GetModelInfo
// until it has answered) every poll_interval. A group is READY when its last poll answered, it is not
// draining and its model is known; a stream failure marks it down at once until a poll started after the
// failure answers again.
//
// Routing is power of two choices (Mitzenmacher): pick two distinct ready, unsaturated groups at random and
// take the one with the lower score, where
//   score = (running_tokens + waiting_tokens + tokens routed here since that poll) * (1 + kv_usage_ratio).
// Polled numbers are up to one poll old, so the tokens routed since the poll are added locally; with p2c a
// burst does not herd onto the one group that looked emptiest at the last poll.
// A group is saturated when its estimated waiting queue (polled waiting + requests routed since the poll
// that did not fit into free batch slots) reaches the max_waiting it reports. When all are, Pick answers
// RESOURCE_EXHAUSTED with a retry hint of about one decode step of the slowest group (50 ms .. 5 s).
//
// Threads: one watcher thread (owned, joined by the destructor) does blocking resolves, starts the polls and frees
// finished polls and dropped groups' channels; each poll's answer is applied on a gRPC callback thread (groups in
// parallel); Pick/MarkDown/Release are called from gRPC reactions. All only take the mutex briefly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls_options.h"
#include "dsv4/v1/coordinator.pb.h"
#include "dsv4/v1/worker.grpc.pb.h"

namespace dsv4::coordinator {

struct GroupPoolOptions {
  std::vector<std::string> targets;              // "host:port" entries; DNS names may resolve to many groups
  absl::Duration poll_interval = absl::Milliseconds(100);
  absl::Duration rpc_timeout = absl::Seconds(1);  // per GetLoad / GetModelInfo poll: the health deadline
  // A group whose load reports seconds_since_progress >= this is stalled: not ready, and reported through
  // on_unanswered like a group that missed its poll. Zero = off.
  absl::Duration engine_stall = absl::ZeroDuration();
  uint64_t seed = 0;                              // p2c random choices (tests pin it)
  // Called on a gRPC callback thread (several at once for different groups), with no pool lock held, after each
  // poll that a group did not answer or answered with a stalled engine (address, why); the coordinator fails over
  // that group's silent streams. Must be thread-safe; may be empty.
  std::function<void(const std::string& address, const std::string& why)> on_unanswered = nullptr;
  // How groups are dialled (plaintext by default). A leader is dialled by IP; with TLS its certificate must
  // carry security.server_name, or when that is empty the host as written in `targets`.
  ChannelSecurity security{};
};

// One group as a request sees it: where to send, and what to release afterwards.
struct GroupHandle {
  std::string address;  // "ip:port" of the leader; the group's identity
  std::shared_ptr<dsv4::v1::Worker::Stub> stub;
  int64_t tokens = 0;   // tokens accounted to the group by Pick, returned by Release
  std::string checkpoint;  // the group's checkpoint_fingerprint ("" when it did not say)
};

// A read-only copy of one group's state, for GetModelInfo, metrics and tests.
struct GroupStatus {
  std::string address;
  bool ready = false;
  std::string why_not_ready;  // last poll error, "draining", "model unknown", ...
  dsv4::v1::GetLoadResponse load;
  int64_t inflight = 0;       // requests this coordinator has on the group now
  int64_t routed_since_poll_tokens = 0;
};

class GroupPool {
 public:
  explicit GroupPool(GroupPoolOptions options);
  ~GroupPool();
  GroupPool(const GroupPool&) = delete;
  GroupPool& operator=(const GroupPool&) = delete;

  // Resolves and polls once (blocking up to rpc_timeout), then starts the watcher thread, which starts a poll of
  // each group every poll_interval unless that group's last poll is still in flight. Never fails for
  // unreachable groups (they become ready when they answer); fails only for a malformed target.
  absl::Status Start();

  // The group for a request of `tokens` tokens (prompt + max_new_tokens), excluding `exclude` addresses and,
  // when `checkpoint` is set, groups serving another checkpoint ("" included: a group that did not say is not
  // known to serve the same one) - a failover resumes a stream only on the model that began it. UNAVAILABLE when
  // no such group is ready; RESOURCE_EXHAUSTED (with the retry hint in the message) when every one is saturated.
  // The caller must Release the handle when its stream ends.
  absl::StatusOr<GroupHandle> Pick(int64_t tokens, const absl::flat_hash_set<std::string>& exclude,
                                   const std::optional<std::string>& checkpoint = std::nullopt);
  void Release(const GroupHandle& group);

  // A stream to the group failed the way a dead or unreachable process does: stop routing to it until a
  // poll that starts after now answers.
  void MarkDown(const std::string& address, const std::string& why);

  // The model served by the ready groups (ready_groups/total_groups filled in); nullopt before any group
  // has answered GetModelInfo. When groups disagree, vocab_size and max_context are the minimum and the
  // checkpoint_fingerprint is the one most ready groups serve.
  std::optional<dsv4::v1::GetModelInfoResponse> ModelInfo() const;
  // Distinct checkpoints among the ready groups (1 normally; more during a rolling upgrade or by mistake).
  int ReadyCheckpoints() const;
  // Why groups are not ready, for an UNAVAILABLE message to clients, counted by kind without addresses:
  // ": 1 engine stalled, 2 not answering its health poll" ("" when all are ready).
  std::string NotReadySummary() const;
  std::vector<GroupStatus> Snapshot() const;
  int ReadyCount() const;

  // Blocks until at least `n` groups are ready or `timeout` passes; for start-up and tests.
  bool WaitForReady(int n, absl::Duration timeout) const;

 private:
  struct Group;
  struct Poll;
  void WatchLoop();
  // Starts a poll of every group without one in flight; `wait`: returns once they all ended (start-up).
  void PollOnce(bool wait);
  void FinishPoll(Poll& poll);
  void ApplyPollLocked(const Poll& poll, absl::Time started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> ResolveTargets();
  double Score(const Group& g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NotReadySummaryLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Saturated(const Group& g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupPoolOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Poll>> polls_ ABSL_GUARDED_BY(mu_);  // started; freed by the watcher once done
  // Stubs of dropped groups that streams still hold; released on the watcher thread once only this holds them.
  std::vector<std::shared_ptr<dsv4::v1::Worker::Stub>> stubs_to_drop_ ABSL_GUARDED_BY(mu_);
  int polls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::string> host_of_ ABSL_GUARDED_BY(mu_);  // resolved address -> target host
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

// Status payload (type URL) on Pick's RESOURCE_EXHAUSTED: the retry hint in milliseconds, as a decimal
// string. GenerateCall sends it to the client as the trailing metadata entry "retry-after-ms".
inline constexpr char kRetryAfterMsPayload[] = "type.dsv4.dev/retry-after-ms";

// Splits "a:1,b:2" into entries, checking each has a host and a port in 1..65535.
absl::StatusOr<std::vector<std::string>> ParseWorkerList(const std::string& list);

}  // namespace dsv4::coordinator
