// See runner.h.
#include "bench/serving/runner.h"

#include <random>

#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"

namespace dsv4::bench {
namespace {

class Tracker {
 public:
  explicit Tracker(size_t n) : records_(n) {}
  void WaitForSlot(int concurrency) {
    absl::MutexLock lock(&mu_);
    auto free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_ < concurrency; };
    mu_.Await(absl::Condition(&free));
    ++inflight_;
  }
  void Done(size_t index, RequestRecord record) {
    absl::MutexLock lock(&mu_);
    records_[index] = std::move(record);
    --inflight_;
    ++done_;
  }
  std::vector<RequestRecord> WaitAll() {
    absl::MutexLock lock(&mu_);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == records_.size(); };
    mu_.Await(absl::Condition(&all));
    return records_;
  }

 private:
  absl::Mutex mu_;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

// One benchmark request's stream; deletes itself when done.
class BenchCall final : public grpc::ClientReadReactor<dsv4::v1::GenerateResponse> {
 public:
  BenchCall(Tracker* tracker, size_t index, dsv4::v1::GenerateRequest request, absl::Duration timeout)
      : tracker_(tracker), index_(index), request_(std::move(request)) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    record_.prompt_len = request_.prompt_token_ids_size();
  }
  void Start(dsv4::v1::Coordinator::Stub& stub) {
    start_ = last_ = absl::Now();
    stub.async()->Generate(&ctx_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    const absl::Time now = absl::Now();
    const int k = chunk_.token_ids_size();
    if (k > 0) {
      if (record_.output_len == 0) {
        record_.ttft_s = absl::ToDoubleSeconds(now - start_);
      } else {
        for (int i = 0; i < k; ++i) record_.itl_s.push_back(absl::ToDoubleSeconds(now - last_) / k);
      }
      record_.output_len += k;
      last_ = now;
    }
    StartRead(&chunk_);
  }
  void OnDone(const grpc::Status& status) override {
    record_.e2e_s = absl::ToDoubleSeconds(absl::Now() - start_);
    record_.ok = status.ok();
    if (!status.ok()) record_.error = status.error_message();
    tracker_->Done(index_, std::move(record_));
    delete this;
  }

 private:
  Tracker* const tracker_;
  const size_t index_;
  const dsv4::v1::GenerateRequest request_;
  grpc::ClientContext ctx_;
  dsv4::v1::GenerateResponse chunk_;
  RequestRecord record_;
  absl::Time start_, last_;
};

}  // namespace

std::vector<RequestRecord> RunBenchmark(dsv4::v1::Coordinator::Stub& stub, const std::vector<BenchRequest>& requests,
                                        const RunOptions& options, double* duration_s) {
  Tracker tracker(requests.size());
  std::mt19937_64 rng(options.seed);
  std::exponential_distribution<double> gap(options.request_rate > 0 ? options.request_rate : 1.0);
  const absl::Time t0 = absl::Now();
  absl::Time next_arrival = t0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (options.request_rate > 0) {
      absl::SleepFor(next_arrival - absl::Now());  // negative = already due
      next_arrival += absl::Seconds(gap(rng));
    }
    tracker.WaitForSlot(options.concurrency);
    dsv4::v1::GenerateRequest req;
    req.set_request_id("bench-" + std::to_string(i));
    req.mutable_prompt_token_ids()->Add(requests[i].prompt.begin(), requests[i].prompt.end());
    auto* s = req.mutable_sampling();
    s->set_max_new_tokens(requests[i].output_len);
    s->set_ignore_eos(true);  // every request produces exactly output_len tokens, as sglang's random dataset
    s->set_temperature(options.temperature);
    if (options.top_logprobs >= 0) {
      s->set_logprobs(true);
      s->set_top_logprobs(options.top_logprobs);
    }
    s->set_seed(options.seed * 1000003 + i);
    (new BenchCall(&tracker, i, std::move(req), options.request_timeout))->Start(stub);
  }
  std::vector<RequestRecord> records = tracker.WaitAll();
  *duration_s = absl::ToDoubleSeconds(absl::Now() - t0);
  return records;
}

}  // namespace dsv4::bench
