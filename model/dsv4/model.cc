// Dsv4Model: loading, cache management, request validation and the top-level forward (embed -> layers ->
// head). The sublayers live in attention.cc (+ kv_update.cc), ffn.cc and head.cc.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/checkpoint/checkpoint.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/rope.h"
#include "common/logging.h"

namespace dsv4::model {
namespace {

bool PoolUsed(const Config& c, KvPool pool) {
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int r = c.CompressRatio(l);
    if (pool == KvPool::kWindow || (r == 4 && (pool == KvPool::kCompressed4 || pool == KvPool::kIndexer)) ||
        (r == 128 && pool == KvPool::kCompressed128))
      return true;
  }
  return false;
}

absl::Status CheckSupported(const Config& c, const ModelOptions& o) {
  if (o.num_threads < 1) return absl::InvalidArgumentError(absl::StrCat("num_threads must be >= 1, got ", o.num_threads));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int r = c.CompressRatio(l);
    if (r != 0 && r != 4 && r != 128)
      return absl::InvalidArgumentError(absl::StrCat("compress_ratios[", l, "] = ", r, ": only 0, 4 and 128 are supported"));
  }
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim > c.head_dim || c.qk_rope_head_dim > c.index_head_dim)
    return absl::InvalidArgumentError(absl::StrCat("qk_rope_head_dim ", c.qk_rope_head_dim, " must be even and fit head_dim and index_head_dim"));
  if (c.num_attention_heads % c.o_groups != 0)
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", c.num_attention_heads, " not divisible by o_groups ", c.o_groups));
  if (o.mode == NumericMode::kProduction) {
    if (c.head_dim != 512 || c.qk_rope_head_dim != 64)
      return absl::InvalidArgumentError("production mode needs head_dim 512 and qk_rope_head_dim 64 (the 584-byte KV row)");
    if (c.index_head_dim % 32 != 0 || (c.index_head_dim & (c.index_head_dim - 1)) != 0)
      return absl::InvalidArgumentError(absl::StrCat("production mode needs a power-of-two index_head_dim (Hadamard), got ", c.index_head_dim));
  }
  return absl::OkStatus();
}

}  // namespace

Dsv4Model::Dsv4Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dsv4Model::~Dsv4Model() = default;
const Config& Dsv4Model::config() const { return impl_->full_config; }
const ModelOptions& Dsv4Model::options() const { return impl_->options; }

absl::StatusOr<std::unique_ptr<Dsv4Model>> Dsv4Model::Load(const std::string& dir, const ModelOptions& options) {
  auto impl = std::make_unique<Impl>();
  DSV4_ASSIGN_OR_RETURN(impl->config, LoadConfig(dir));
  DSV4_RETURN_IF_ERROR(CheckSupported(impl->config, options));
  impl->options = options;
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::Checkpoint> ck, ckpt::Checkpoint::Open(dir));
  impl->full_config = impl->config;
  if (options.tp_comm != nullptr && options.tp_comm->world() > 1) {
    const comm::ShardSpec spec{options.tp_comm->rank(), options.tp_comm->world()};
    DSV4_ASSIGN_OR_RETURN(comm::ShardLayout layout, comm::PlanShardLayout(impl->config, spec));
    impl->shard = std::make_unique<comm::ShardLayout>(layout);
    impl->tp = options.tp_comm;
  }
  DSV4_ASSIGN_OR_RETURN(impl->weights, LoadWeights(*ck, impl->config, impl->shard.get(), options.on_layer_loaded));
  if (impl->shard != nullptr) {
    // The forward runs on this rank's heads and output groups only; everything else keeps the full config.
    impl->config.num_attention_heads = impl->shard->heads.size;
    impl->config.o_groups = impl->shard->groups.size;
    DSV4_LOG_INFO("tensor parallel rank {} of {}: heads [{}, {}), experts [{}, {}), vocab [{}, {}); resident {} MiB",
                  impl->shard->spec.rank, impl->shard->spec.world, impl->shard->heads.begin,
                  impl->shard->heads.end(), impl->shard->experts.begin, impl->shard->experts.end(),
                  impl->shard->vocab.begin, impl->shard->vocab.end(), comm::ResidentBytes() >> 20);
  }
  impl->cpu = std::make_unique<kernels::cpu::CpuOps>(options.num_threads);
  impl->ops = impl->cpu.get();
  for (int l = 0; l < impl->config.num_hidden_layers; ++l)
    impl->inv_freq.push_back(LayerInvFreq(impl->config, impl->config.CompressRatio(l)));
  impl->cache = std::make_unique<KvCache>(impl->config, options.mode);
  return std::unique_ptr<Dsv4Model>(new Dsv4Model(std::move(impl)));
}

int64_t Dsv4Model::PageBytes(KvPool pool, int page_rows) const {
  const KvCache& cache = *impl_->cache;
  return cache.LayerPageBytes(pool, page_rows) * static_cast<int64_t>(cache.Layers(pool).size());
}

int64_t Dsv4Model::RowsNeeded(const Config& c, KvPool pool, int64_t n) {
  if (n <= 0 || !PoolUsed(c, pool)) return 0;
  switch (pool) {
    case KvPool::kWindow: return c.sliding_window;
    case KvPool::kCompressed4:
    case KvPool::kIndexer: return n / 4;
    case KvPool::kCompressed128: return n / 128;
  }
  return 0;
}

absl::Status Dsv4Model::AllocateCache(std::array<int64_t, kNumKvPools> pages, int page_rows, int slots) {
  return impl_->cache->Allocate(pages, page_rows, slots);
}

absl::Status Dsv4Model::ResetState(int32_t slot) {
  if (!impl_->cache->allocated()) return absl::FailedPreconditionError("ResetState before AllocateCache");
  if (slot < 0 || slot >= impl_->cache->slots())
    return absl::InvalidArgumentError(absl::StrCat("state_slot ", slot, " out of [0, ", impl_->cache->slots(), ")"));
  impl_->cache->ResetSlot(slot);
  return absl::OkStatus();
}

void Dsv4Model::Impl::AllReduce(float* y, int64_t n) {
  if (tp == nullptr) return;
  const metrics::Phase resume = phase;  // the collective's time is comm; the sublayer's phase resumes after it
  BeginPhase(metrics::Phase::kComm);
  const absl::Status s = tp->AllReduceSum(y, static_cast<size_t>(n));
  if (!s.ok() && tp_status.ok()) tp_status = s;
  BeginPhase(resume);
}

void Dsv4Model::SetPhaseTimer(metrics::PhaseTimer* timer) { impl_->phase_timer = timer; }

int32_t Dsv4Model::Impl::PhysicalRow(const SeqBlockTables& t, KvPool pool, int64_t logical) const {
  if (pool == KvPool::kWindow) logical %= config.sliding_window;
  const int P = cache->page_rows();
  return static_cast<int32_t>(t.pages[static_cast<int>(pool)][logical / P] * P + logical % P);
}

namespace {

// Every check a step needs before it may touch any state: errors name the chunk and the field.
absl::Status ValidateChunks(const Dsv4Model::Impl& m, std::span<const SeqChunk> chunks) {
  const KvCache& cache = *m.cache;
  if (!cache.allocated()) return absl::FailedPreconditionError("Forward before AllocateCache");
  if (chunks.empty()) return absl::InvalidArgumentError("Forward with no chunks");
  std::set<int32_t> slots;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SeqChunk& ch = chunks[i];
    const std::string who = absl::StrCat("chunk ", i, ": ");
    if (ch.tables == nullptr) return absl::InvalidArgumentError(who + "tables is null");
    if (ch.tokens.empty()) return absl::InvalidArgumentError(who + "no tokens");
    const int32_t slot = ch.tables->state_slot;
    if (slot < 0 || slot >= cache.slots())
      return absl::InvalidArgumentError(absl::StrCat(who, "state_slot ", slot, " out of [0, ", cache.slots(), ")"));
    if (!slots.insert(slot).second) return absl::InvalidArgumentError(absl::StrCat(who, "state_slot ", slot, " used twice in one step"));
    if (ch.start_pos != const_cast<KvCache&>(cache).next_pos(slot))
      return absl::InvalidArgumentError(absl::StrCat(who, "start_pos ", ch.start_pos, " but state slot ", slot, " has consumed ",
                                                     const_cast<KvCache&>(cache).next_pos(slot), " tokens"));
    const int64_t end = int64_t{ch.start_pos} + static_cast<int64_t>(ch.tokens.size());
    if (end > m.config.max_position_embeddings)
      return absl::InvalidArgumentError(absl::StrCat(who, "positions up to ", end, " exceed max_position_embeddings ", m.config.max_position_embeddings));
    for (size_t j = 0; j < ch.tokens.size(); ++j) {
      if (ch.tokens[j] < 0 || ch.tokens[j] >= m.config.vocab_size)
        return absl::InvalidArgumentError(absl::StrCat(who, "token ", j, " = ", ch.tokens[j], " out of [0, ", m.config.vocab_size, ")"));
    }
    for (int p = 0; p < kNumKvPools; ++p) {
      const auto pool = static_cast<KvPool>(p);
      int64_t rows = Dsv4Model::RowsNeeded(m.config, pool, end);
      if (pool == KvPool::kWindow) rows = std::min<int64_t>(rows, end);
      const int64_t need = (rows + cache.page_rows() - 1) / cache.page_rows();
      const auto& pages = ch.tables->pages[p];
      if (static_cast<int64_t>(pages.size()) < need)
        return absl::InvalidArgumentError(absl::StrCat(who, "pool ", p, " has ", pages.size(), " pages, needs ", need, " for ", end, " positions"));
      for (int64_t k = 0; k < need; ++k) {
        if (pages[k] < 0 || pages[k] >= cache.pages(pool))
          return absl::InvalidArgumentError(absl::StrCat(who, "pool ", p, " page ", pages[k], " out of [0, ", cache.pages(pool), ")"));
      }
    }
  }
  return absl::OkStatus();
}

// Runs the layers over the step's tokens and returns the logits of `rows` (indices into the flat batch).
absl::Status RunForward(Dsv4Model::Impl& m, std::span<const SeqChunk> chunks, bool all_rows, std::vector<float>* out,
                        float* out_ptr) {
  DSV4_RETURN_IF_ERROR(ValidateChunks(m, chunks));
  m.tp_status = absl::OkStatus();
  const Config& c = m.config;
  StepBatch batch;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < chunks.size(); ++i) {
    batch.tables.push_back(chunks[i].tables);
    for (size_t j = 0; j < chunks[i].tokens.size(); ++j) {
      if (all_rows || j + 1 == chunks[i].tokens.size()) rows.push_back(batch.size());
      batch.tokens.push_back(chunks[i].tokens[j]);
      batch.pos.push_back(chunks[i].start_pos + static_cast<int32_t>(j));
      batch.chunk_of.push_back(static_cast<int32_t>(i));
    }
  }
  const int64_t T = batch.size(), D = c.hidden_size, S = c.hc_mult;
  m.BeginPhase(metrics::Phase::kDense);  // the embedding lookup
  std::vector<float> x(T * S * D);  // every stream starts as the embedding
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s)
      std::copy_n(m.weights->embed.ptr() + int64_t{batch.tokens[t]} * D, D, x.data() + (t * S + s) * D);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    AttentionSublayer(m, l, batch, x);
    FfnSublayer(m, l, batch, x);
  }
  for (const SeqChunk& ch : chunks) m.cache->next_pos(ch.tables->state_slot) += static_cast<int64_t>(ch.tokens.size());
  if (out) {
    out->resize(rows.size() * c.vocab_size);
    out_ptr = out->data();
  }
  Head(m, x, rows, out_ptr);
  if (m.phase_timer != nullptr) m.phase_timer->End(m.phase);
  return m.tp_status;
}

}  // namespace

absl::Status Dsv4Model::Forward(std::span<const SeqChunk> chunks, float* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("Forward: logits is null");
  return RunForward(*impl_, chunks, false, nullptr, logits);
}

absl::Status Dsv4Model::ForwardAllLogits(std::span<const SeqChunk> chunks, std::vector<float>* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("ForwardAllLogits: logits is null");
  return RunForward(*impl_, chunks, true, logits, nullptr);
}

}  // namespace dsv4::model
