// See fake_worker.h.
#include "tests/coordinator/fake_worker.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace dsv4::testing {

namespace {

uint64_t Mix(uint64_t h, uint64_t v) {  // splitmix64 step: cheap, portable, well spread
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

}  // namespace

float FakeLogprob(int32_t token) { return -0.01f * static_cast<float>(token % 97); }

int32_t FakeNextToken(const std::vector<int32_t>& sequence, bool sampled, uint64_t seed, int vocab_size) {
  uint64_t h = sampled ? Mix(0x5eed, seed) : 0x9eed;
  for (int32_t t : sequence) h = Mix(h, static_cast<uint64_t>(t));
  // Tokens 0 and 1 (the fake's bos/eos) are never produced, so only stop_token_ids end a stream early.
  return 2 + static_cast<int32_t>(h % static_cast<uint64_t>(vocab_size - 2));
}

std::vector<int32_t> FakeGeneration(std::vector<int32_t> prompt, int max_new_tokens, bool sampled, uint64_t seed,
                                    int vocab_size) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_new_tokens; ++i) {
    out.push_back(FakeNextToken(prompt, sampled, seed, vocab_size));
    prompt.push_back(out.back());
  }
  return out;
}

class FakeWorker::Service final : public dsv4::v1::Worker::Service {
 public:
  explicit Service(FakeWorker* w) : w_(w) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const dsv4::v1::GenerateRequest* req,
                        grpc::ServerWriter<dsv4::v1::GenerateResponse>* writer) override {
    w_->generate_calls_++;
    {
      absl::MutexLock lock(&w_->mu_);
      w_->requests_.push_back(*req);
    }
    if (w_->options_.queue_full) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "waiting queue full");
    w_->active_++;
    grpc::Status status = Stream(ctx, *req, writer);
    w_->active_--;
    return status;
  }

  grpc::Status GetLoad(grpc::ServerContext* ctx, const dsv4::v1::GetLoadRequest*,
                       dsv4::v1::GetLoadResponse* resp) override {
    while (w_->load_frozen_.load() && !ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(1));
    absl::MutexLock lock(&w_->mu_);
    *resp = w_->extra_load_;
    resp->set_running(resp->running() + w_->active_.load());
    // A real engine's heartbeat: with streams frozen and requests open, no step has finished since the freeze.
    if (w_->streams_frozen_.load() && w_->active_.load() > 0) {
      resp->set_seconds_since_progress(absl::ToDoubleSeconds(absl::Now() - w_->frozen_at_));
    }
    if (resp->max_batch() == 0) resp->set_max_batch(32);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const dsv4::v1::GetModelInfoRequest*,
                            dsv4::v1::GetModelInfoResponse* resp) override {
    resp->set_model_name("fake-dsv4");
    resp->set_vocab_size(w_->options_.vocab_size);
    resp->set_max_context(w_->options_.max_context);
    resp->set_eos_token_id(w_->options_.eos_token_id);
    resp->set_bos_token_id(0);
    resp->set_num_layers(2);
    resp->set_weight_format("fake");
    absl::MutexLock lock(&w_->mu_);
    resp->set_checkpoint_fingerprint(w_->checkpoint_);
    return grpc::Status::OK;
  }

 private:
  grpc::Status Stream(grpc::ServerContext* ctx, const dsv4::v1::GenerateRequest& req,
                      grpc::ServerWriter<dsv4::v1::GenerateResponse>* writer) {
    const auto& s = req.sampling();
    const bool sampled = s.temperature() > 0;
    if (sampled && !s.has_seed()) {
      // A real worker would pick a seed of its own: a resubmission without the pinned seed diverges.
      return grpc::Status(grpc::StatusCode::INTERNAL, "fake worker: sampled request without a pinned seed");
    }
    std::vector<int32_t> seq(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
    int produced = req.resume_generated();  // resumed tokens count against max_new_tokens
    while (produced < s.max_new_tokens()) {
      while (w_->streams_frozen_.load() && !w_->killed_.load()) absl::SleepFor(absl::Milliseconds(1));
      if (ctx->IsCancelled()) {
        w_->cancelled_++;
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
      absl::SleepFor(w_->options_.step);
      const int32_t tok = FakeNextToken(seq, sampled, s.seed(), w_->options_.vocab_size);
      seq.push_back(tok);
      ++produced;
      dsv4::v1::GenerateResponse chunk;
      chunk.set_request_id(req.request_id());
      chunk.add_token_ids(tok);
      if (s.logprobs()) {
        dsv4::v1::TokenLogprob* lp = chunk.add_logprobs();
        lp->set_logprob(FakeLogprob(tok));
        for (int k = 0; k < s.top_logprobs(); ++k) {
          auto* t = lp->add_top();
          t->set_token_id(k);
          t->set_logprob(FakeLogprob(k));
        }
      }
      const bool stop = std::find(s.stop_token_ids().begin(), s.stop_token_ids().end(), tok) !=
                        s.stop_token_ids().end();
      if (stop || produced == s.max_new_tokens()) {
        chunk.set_finish_reason(stop ? dsv4::v1::FINISH_REASON_STOP : dsv4::v1::FINISH_REASON_LENGTH);
        chunk.mutable_usage()->set_completion_tokens(produced);
      }
      if (!writer->Write(chunk)) {
        w_->cancelled_++;
        return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      }
      if (w_->options_.die_after_tokens > 0 && ++w_->streamed_ == w_->options_.die_after_tokens) {
        w_->killer_ = std::thread([w = w_] { w->Kill(); });
        while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(1));  // dead processes say nothing
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "killed");
      }
      if (chunk.finish_reason() != dsv4::v1::FINISH_REASON_UNSPECIFIED) break;
    }
    w_->completed_++;
    return grpc::Status::OK;
  }

  FakeWorker* const w_;
};

FakeWorker::FakeWorker(FakeWorkerOptions options)
    : options_(options), service_(std::make_unique<Service>(this)), checkpoint_(options.checkpoint) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
}

FakeWorker::~FakeWorker() {
  Thaw();  // frozen handlers would hold up the shutdown
  if (killer_.joinable()) killer_.join();
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
}

void FakeWorker::Kill() {
  if (killed_.exchange(true)) return;
  server_->Shutdown(std::chrono::system_clock::now());
}

void FakeWorker::SetLoad(const dsv4::v1::GetLoadResponse& extra) {
  absl::MutexLock lock(&mu_);
  const bool draining = extra_load_.draining();
  extra_load_ = extra;
  extra_load_.set_draining(draining || extra.draining());
}

void FakeWorker::Freeze(bool streams_only) {
  {
    absl::MutexLock lock(&mu_);
    frozen_at_ = absl::Now();
  }
  streams_frozen_ = true;
  load_frozen_ = !streams_only;
}

void FakeWorker::Thaw() {
  streams_frozen_ = false;
  load_frozen_ = false;
}

void FakeWorker::SetCheckpoint(const std::string& fingerprint) {
  absl::MutexLock lock(&mu_);
  checkpoint_ = fingerprint;
}

void FakeWorker::SetDraining(bool draining) {
  absl::MutexLock lock(&mu_);
  extra_load_.set_draining(draining);
}

std::vector<dsv4::v1::GenerateRequest> FakeWorker::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

}  // namespace dsv4::testing
