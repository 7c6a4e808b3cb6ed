// Dsv4Model: loading, cache and workspace planning, step validation, plan packing and the top-level forward
// (embed -> layers -> head). The sublayers live in attention.cc, ffn.cc and head.cc.
#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/checkpoint/checkpoint.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/rope.h"

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
  if (o.backend == nullptr) return absl::InvalidArgumentError("ModelOptions::backend is required");
  if (o.max_step_tokens < 1) return absl::InvalidArgumentError(absl::StrCat("max_step_tokens must be >= 1, got ", o.max_step_tokens));
  if (o.max_context < 1) return absl::InvalidArgumentError(absl::StrCat("max_context must be >= 1, got ", o.max_context));
  if (o.shard.world > 1 && (o.collectives == nullptr || o.collectives->world() != o.shard.world ||
                            o.collectives->rank() != o.shard.rank)) {
    return absl::InvalidArgumentError(absl::StrCat("shard rank ", o.shard.rank, " of ", o.shard.world,
                                                   " needs the collectives of that rank and world"));
  }
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
  DSV4_ASSIGN_OR_RETURN(const Config config, LoadConfig(dir));
  DSV4_RETURN_IF_ERROR(CheckSupported(config, options));
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::Checkpoint> ck, ckpt::Checkpoint::Open(dir));
  return Load(*ck, config, options);
}

absl::StatusOr<std::unique_ptr<Dsv4Model>> Dsv4Model::Load(const ckpt::Checkpoint& checkpoint, const Config& config,
                                                           const ModelOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  DSV4_RETURN_IF_ERROR(CheckSupported(impl->config, options));
  impl->options = options;
  impl->backend = options.backend;
  const ckpt::Checkpoint* ck = &checkpoint;
  impl->full_config = impl->config;
  if (options.shard.world > 1) {
    DSV4_ASSIGN_OR_RETURN(ShardLayout layout, PlanShardLayout(impl->config, options.shard));
    impl->shard = std::make_unique<ShardLayout>(layout);
  }
  DSV4_ASSIGN_OR_RETURN(impl->weights, LoadWeights(*ck, impl->config, *impl->backend, impl->shard.get(),
                                                   options.on_layer_loaded, options.weight_load));
  if (impl->shard != nullptr) {
    // The forward runs on this rank's heads and output groups only; everything else keeps the full config.
    impl->config.num_attention_heads = impl->shard->heads.size;
    impl->config.o_groups = impl->shard->groups.size;
    DSV4_LOG_INFO("tensor parallel rank {} of {}: heads [{}, {}), experts [{}, {}), vocab [{}, {}); resident {} MiB",
                  impl->shard->spec.rank, impl->shard->spec.world, impl->shard->heads.begin,
                  impl->shard->heads.end(), impl->shard->experts.begin, impl->shard->experts.end(),
                  impl->shard->vocab.begin, impl->shard->vocab.end(), ResidentBytes() >> 20);
  }
  for (int l = 0; l < impl->config.num_hidden_layers; ++l) {
    const std::vector<float> inv = LayerInvFreq(impl->config, impl->config.CompressRatio(l));
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer b, impl->backend->UploadF32(inv));
    impl->inv_freq.push_back(std::move(b));
  }
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

namespace {

// Pages per sequence of each pool at the planned maximum context (the block-table strides).
std::array<int64_t, kNumKvPools> TableStrides(const Config& c, int64_t max_context, int page_rows) {
  std::array<int64_t, kNumKvPools> stride{};
  for (int p = 0; p < kNumKvPools; ++p) {
    const int64_t rows = Dsv4Model::RowsNeeded(c, static_cast<KvPool>(p), max_context);
    stride[p] = std::max<int64_t>(1, (rows + page_rows - 1) / page_rows);
  }
  return stride;
}

PlanLayout MakePlanLayout(int64_t T, int64_t B, const std::array<int64_t, kNumKvPools>& stride) {
  PlanLayout l;
  int64_t at = 0;
  auto take = [&](int64_t n) { const int64_t o = at; at += n; return o; };
  // First, so its 8-byte fields are aligned (the plan buffer is): one SampleParams (8 int32s) per sequence.
  l.sample = take(B * kSampleParamsInts);
  l.tokens = take(T);
  l.pos = take(T);
  l.seq = take(T);
  l.head_rows = take(T);
  l.seq_first = take(B);
  l.seq_len = take(B);
  l.slot = take(B);
  for (int p = 0; p < kNumKvPools; ++p) {
    l.stride[p] = stride[p];
    l.table[p] = take(B * stride[p]);
  }
  l.total = at;
  return l;
}

// Allocates every activation buffer of the workspace for T tokens and B sequences.
absl::Status AllocateWorkspace(kernels::Backend& be, const Config& c, const ShardLayout* shard, int64_t T, int64_t B,
                               const PlanLayout& plan, Workspace& ws) {
  const int64_t D = c.hidden_size, S = c.hc_mult, H = c.num_attention_heads, Dh = c.head_dim;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
  const int64_t V = c.vocab_size, Vlocal = shard != nullptr ? shard->vocab.size : V;
  ws = Workspace{};
  ws.max_tokens = T;
  ws.max_seqs = B;
  ws.head_rows = std::max<int64_t>(B, 64);
  const int64_t R = ws.head_rows;
  auto f32 = [&](kernels::Buffer& b, int64_t n) -> absl::Status {
    DSV4_ASSIGN_OR_RETURN(b, be.Allocate(std::max<int64_t>(n, 1) * 4, kernels::MemoryKind::kWorkspace));
    return absl::OkStatus();
  };
  for (auto& x : ws.x) DSV4_RETURN_IF_ERROR(f32(x, T * S * D));
  DSV4_RETURN_IF_ERROR(f32(ws.a, T * D));
  DSV4_RETURN_IF_ERROR(f32(ws.post, T * S));
  DSV4_RETURN_IF_ERROR(f32(ws.comb, T * S * S));
  DSV4_RETURN_IF_ERROR(f32(ws.cq, T * c.q_lora_rank));
  DSV4_RETURN_IF_ERROR(f32(ws.q, T * H * Dh));
  DSV4_RETURN_IF_ERROR(f32(ws.kv, T * Dh));
  DSV4_RETURN_IF_ERROR(f32(ws.comp_kv, T * 2 * Dh));
  DSV4_RETURN_IF_ERROR(f32(ws.comp_gate, T * 2 * Dh));
  DSV4_RETURN_IF_ERROR(f32(ws.idx_q, T * IH * ID));
  DSV4_RETURN_IF_ERROR(f32(ws.idx_w, T * IH));
  DSV4_RETURN_IF_ERROR(f32(ws.idx_kv, T * 2 * ID));
  DSV4_RETURN_IF_ERROR(f32(ws.idx_gate, T * 2 * ID));
  DSV4_RETURN_IF_ERROR(f32(ws.selected, T * c.index_topk));  // int32, same size
  DSV4_RETURN_IF_ERROR(f32(ws.selected_count, T));
  DSV4_RETURN_IF_ERROR(f32(ws.o, T * H * Dh));
  DSV4_RETURN_IF_ERROR(f32(ws.z, T * c.o_groups * c.o_lora_rank));
  DSV4_RETURN_IF_ERROR(f32(ws.y, T * D));
  DSV4_RETURN_IF_ERROR(f32(ws.h, R * D));
  DSV4_RETURN_IF_ERROR(f32(ws.logits, R * Vlocal));
  if (shard != nullptr) DSV4_RETURN_IF_ERROR(f32(ws.logits_full, R * V));
  DSV4_RETURN_IF_ERROR(f32(ws.sampled, R));  // int32, same size
  DSV4_ASSIGN_OR_RETURN(ws.plan, be.Allocate(plan.total * 4, kernels::MemoryKind::kWorkspace));
  DSV4_ASSIGN_OR_RETURN(ws.plan_host, be.Allocate(plan.total * 4, kernels::MemoryKind::kHostStaging));
  return absl::OkStatus();
}

}  // namespace

absl::Status Dsv4Model::AllocateCache(std::array<int64_t, kNumKvPools> pages, int page_rows, int slots) {
  Impl& m = *impl_;
  const Config& c = m.config;
  DSV4_RETURN_IF_ERROR(m.cache->Allocate(*m.backend, pages, page_rows, slots, m.options.max_step_tokens));
  m.slot_seen.assign(slots, 0);
  const int64_t T = m.options.max_step_tokens, B = slots;
  m.plan = MakePlanLayout(T, B, TableStrides(c, m.options.max_context, page_rows));
  DSV4_RETURN_IF_ERROR(AllocateWorkspace(*m.backend, c, m.shard.get(), T, B, m.plan, m.ws));
  const int64_t Is = c.moe_intermediate_size * c.n_shared_experts / (m.shard != nullptr ? m.shard->spec.world : 1);
  DSV4_RETURN_IF_ERROR(m.backend->Reserve({.max_tokens = T, .max_seqs = B, .max_context = m.options.max_context,
                                           .hidden = c.hidden_size, .hc_mult = c.hc_mult,
                                           .heads = c.num_attention_heads, .head_dim = c.head_dim,
                                           .window = c.sliding_window, .index_heads = c.index_n_heads,
                                           .index_dim = c.index_head_dim, .index_topk = c.index_topk,
                                           .experts = c.n_routed_experts, .experts_per_token = c.num_experts_per_tok,
                                           .moe_inter = c.moe_intermediate_size, .shared_inter = Is,
                                           .vocab = m.shard != nullptr ? m.shard->vocab.size : c.vocab_size}));
  const auto held = m.backend->allocated();
  DSV4_LOG_INFO("{} backend memory: weights {} MiB, kv cache {} MiB, state {} MiB, workspace {} MiB (steps of <= {} "
                "tokens, {} sequences, context <= {})",
                m.backend->name(), held[0] >> 20, held[1] >> 20, held[2] >> 20, held[3] >> 20, T, B,
                m.options.max_context);
  return absl::OkStatus();
}

absl::Status Dsv4Model::ResetState(int32_t slot) {
  if (!impl_->cache->allocated()) return absl::FailedPreconditionError("ResetState before AllocateCache");
  if (slot < 0 || slot >= impl_->cache->slots())
    return absl::InvalidArgumentError(absl::StrCat("state_slot ", slot, " out of [0, ", impl_->cache->slots(), ")"));
  impl_->cache->ResetSlot(*impl_->backend, slot);
  return absl::OkStatus();
}

void Dsv4Model::Impl::AllReduce(float* y, int64_t n) {
  if (options.collectives == nullptr || options.collectives->world() == 1) return;
  const Phase resume = phase;  // the collective's time is comm; the sublayer's phase resumes after it
  BeginPhase(Phase::kComm);
  const absl::Status s = options.collectives->AllReduceSum(y, n);
  if (!s.ok() && tp_status.ok()) tp_status = s;
  BeginPhase(resume);
}

void Dsv4Model::SetPhaseHook(PhaseHook* hook) { impl_->options.phase_hook = hook; }

Dsv4Model::CacheMemory Dsv4Model::CacheMemoryForBench() const {
  const KvCache& cache = *impl_->cache;
  CacheMemory mem;
  if (!cache.allocated()) return mem;
  for (int p = 0; p < kNumKvPools; ++p) {
    const auto pool = static_cast<KvPool>(p);
    mem.pool[p] = cache.Storage(pool).data();
    mem.pool_bytes[p] = cache.Storage(pool).bytes();
    mem.fp8_rows[p] = cache.Format(pool) == kernels::KvFormat::kFp8Row584;
  }
  mem.state = cache.StateBase();
  mem.state_floats = cache.StateStride() * cache.slots();
  return mem;
}

absl::Status Dsv4Model::SetSlotPositionForBench(int32_t slot, int64_t positions) {
  KvCache& cache = *impl_->cache;
  if (!cache.allocated()) return absl::FailedPreconditionError("SetSlotPositionForBench before AllocateCache");
  if (slot < 0 || slot >= cache.slots())
    return absl::InvalidArgumentError(absl::StrCat("state_slot ", slot, " out of [0, ", cache.slots(), ")"));
  if (positions < 0 || positions >= impl_->options.max_context)
    return absl::InvalidArgumentError(absl::StrCat("positions ", positions, " out of [0, max_context ",
                                                   impl_->options.max_context, ")"));
  cache.next_pos(slot) = positions;
  return absl::OkStatus();
}

namespace {

// Every check a step needs before it may touch any state: errors name the chunk and the field. Allocates
// nothing unless it fails (a decode step allocates nothing at all).
absl::Status ValidateChunks(Dsv4Model::Impl& m, std::span<const SeqChunk> chunks, const StepShape& shape) {
  const KvCache& cache = *m.cache;
  if (!cache.allocated()) return absl::FailedPreconditionError("Forward before AllocateCache");
  if (shape.seqs > m.ws.max_seqs)
    return absl::InvalidArgumentError(absl::StrCat("step has ", shape.seqs, " chunks, more than the ", m.ws.max_seqs,
                                                   " state slots"));
  if (shape.tokens > m.ws.max_tokens)
    return absl::InvalidArgumentError(absl::StrCat("step has ", shape.tokens,
                                                   " tokens, more than the planned max_step_tokens ", m.ws.max_tokens));
  if (shape.seqs < 0 || shape.tokens < shape.seqs || shape.max_seq_len < 1)
    return absl::InvalidArgumentError(absl::StrCat("step shape of ", shape.tokens, " tokens, ", shape.seqs,
                                                   " sequences, chunks of <= ", shape.max_seq_len,
                                                   " tokens is not a shape"));
  if (static_cast<int64_t>(chunks.size()) > shape.seqs)
    return absl::InvalidArgumentError(absl::StrCat("step has ", chunks.size(), " chunks, more than its shape's ",
                                                   shape.seqs, " sequences"));
  std::fill(m.slot_seen.begin(), m.slot_seen.end(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SeqChunk& ch = chunks[i];
    auto who = [i] { return absl::StrCat("chunk ", i, ": "); };
    if (ch.tables == nullptr) return absl::InvalidArgumentError(who() + "tables is null");
    if (ch.tokens.empty()) return absl::InvalidArgumentError(who() + "no tokens");
    if (static_cast<int64_t>(ch.tokens.size()) > shape.max_seq_len)
      return absl::InvalidArgumentError(absl::StrCat(who(), ch.tokens.size(), " tokens, more than the step shape's ",
                                                     shape.max_seq_len, " per chunk"));
    const int32_t slot = ch.tables->state_slot;
    if (slot < 0 || slot >= cache.slots())
      return absl::InvalidArgumentError(absl::StrCat(who(), "state_slot ", slot, " out of [0, ", cache.slots(), ")"));
    if (m.slot_seen[slot]++ != 0)
      return absl::InvalidArgumentError(absl::StrCat(who(), "state_slot ", slot, " used twice in one step"));
    if (ch.start_pos != cache.next_pos(slot))
      return absl::InvalidArgumentError(absl::StrCat(who(), "start_pos ", ch.start_pos, " but state slot ", slot,
                                                     " has consumed ", cache.next_pos(slot), " tokens"));
    const int64_t end = int64_t{ch.start_pos} + static_cast<int64_t>(ch.tokens.size());
    if (end > m.options.max_context)
      return absl::InvalidArgumentError(absl::StrCat(who(), "positions up to ", end, " exceed the planned max_context ",
                                                     m.options.max_context));
    if (end > m.config.max_position_embeddings)
      return absl::InvalidArgumentError(absl::StrCat(who(), "positions up to ", end, " exceed max_position_embeddings ",
                                                     m.config.max_position_embeddings));
    for (size_t j = 0; j < ch.tokens.size(); ++j) {
      if (ch.tokens[j] < 0 || ch.tokens[j] >= m.config.vocab_size)
        return absl::InvalidArgumentError(absl::StrCat(who(), "token ", j, " = ", ch.tokens[j], " out of [0, ",
                                                       m.config.vocab_size, ")"));
    }
    for (int p = 0; p < kNumKvPools; ++p) {
      const auto pool = static_cast<KvPool>(p);
      int64_t rows = Dsv4Model::RowsNeeded(m.config, pool, end);
      if (pool == KvPool::kWindow) rows = std::min<int64_t>(rows, end);
      const int64_t need = (rows + cache.page_rows() - 1) / cache.page_rows();
      const auto& pages = ch.tables->pages[p];
      if (static_cast<int64_t>(pages.size()) < need)
        return absl::InvalidArgumentError(absl::StrCat(who(), "pool ", p, " has ", pages.size(), " pages, needs ", need,
                                                       " for ", end, " positions"));
      for (int64_t k = 0; k < need; ++k) {
        if (pages[k] < 0 || pages[k] >= cache.pages(pool))
          return absl::InvalidArgumentError(absl::StrCat(who(), "pool ", p, " page ", pages[k], " out of [0, ",
                                                         cache.pages(pool), ")"));
      }
    }
    total += static_cast<int64_t>(ch.tokens.size());
  }
  if (total > shape.tokens)
    return absl::InvalidArgumentError(absl::StrCat("step has ", total, " tokens, more than its shape's ",
                                                   shape.tokens));
  return absl::OkStatus();
}

// Packs the step's plan, padded to `shape`, into the host staging buffer (one copy to the backend follows).
// Head rows: each chunk's last token, or every token when all_rows; then one per padding sequence (its padding
// token, or the last token of the step). Returns the number of head rows.
int64_t PackPlan(Dsv4Model::Impl& m, std::span<const SeqChunk> chunks, const StepShape& shape, bool all_rows,
                 std::span<const kernels::SampleParams> sampling) {
  const PlanLayout& l = m.plan;
  int32_t* p = m.ws.plan_host.as<int32_t>();
  // Sampling rows: the chunks' (when given), then padding rows (temperature -1: the Sample op writes token -1).
  const kernels::SampleParams padding{.temperature = -1.f};
  for (int64_t b = 0; b < shape.seqs; ++b) {
    const kernels::SampleParams& sp = b < static_cast<int64_t>(sampling.size()) ? sampling[b] : padding;
    std::memcpy(p + l.sample + b * kSampleParamsInts, &sp, sizeof(sp));
  }
  int64_t t = 0, rows = 0;
  const int64_t B = static_cast<int64_t>(chunks.size());
  for (int64_t b = 0; b < B; ++b) {
    const SeqChunk& ch = chunks[b];
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    p[l.seq_first + b] = static_cast<int32_t>(t);
    p[l.seq_len + b] = static_cast<int32_t>(n);
    p[l.slot + b] = ch.tables->state_slot;
    for (int q = 0; q < kNumKvPools; ++q) {
      int32_t* row = p + l.table[q] + b * l.stride[q];
      const auto& pages = ch.tables->pages[q];
      const int64_t used = std::min<int64_t>(l.stride[q], static_cast<int64_t>(pages.size()));
      std::copy_n(pages.data(), used, row);
      std::fill(row + used, row + l.stride[q], -1);
    }
    for (int64_t j = 0; j < n; ++j, ++t) {
      p[l.tokens + t] = ch.tokens[j];
      p[l.pos + t] = ch.start_pos + static_cast<int32_t>(j);
      p[l.seq + t] = static_cast<int32_t>(b);
      if (all_rows || j + 1 == n) p[l.head_rows + rows++] = static_cast<int32_t>(t);
    }
  }
  // Padding: sequences with no tokens and no state slot, tokens at position -1 (their block-table rows are never
  // read: every op skips a padding sequence before touching its pages).
  const int64_t real_t = t;
  for (int64_t b = B; b < shape.seqs; ++b) {
    p[l.seq_first + b] = static_cast<int32_t>(std::min(real_t, shape.tokens - 1));
    p[l.seq_len + b] = 0;
    p[l.slot + b] = -1;
    p[l.head_rows + rows++] = static_cast<int32_t>(std::min(real_t + (b - B), shape.tokens - 1));
  }
  for (; t < shape.tokens; ++t) {
    p[l.tokens + t] = 0;
    p[l.pos + t] = -1;
    p[l.seq + t] = static_cast<int32_t>(std::max<int64_t>(0, shape.seqs - 1));
  }
  return rows;
}

// The sublayers' view of a plan of `shape` already in backend memory.
StepContext MakeStepContext(Dsv4Model::Impl& m, const StepShape& shape) {
  const int32_t* plan = m.ws.plan.as<const int32_t>();
  StepContext s{.ops = m.backend->ops(), .config = m.config, .mode = m.options.mode, .cache = *m.cache, .ws = m.ws,
                .step = {.pos = plan + m.plan.pos, .seq = plan + m.plan.seq, .seq_first = plan + m.plan.seq_first,
                         .seq_len = plan + m.plan.seq_len, .state_slot = plan + m.plan.slot, .t = shape.tokens,
                         .b = shape.seqs, .max_seq_len = shape.max_seq_len},
                .tokens = plan + m.plan.tokens, .tables = {}, .inv_freq = &m.inv_freq};
  for (int q = 0; q < kNumKvPools; ++q) s.tables[q] = {.pages = plan + m.plan.table[q], .stride = m.plan.stride[q]};
  return s;
}

// Validates, packs and copies the plan in, and advances the slots' positions; *rows gets the head rows.
absl::Status Prepare(Dsv4Model::Impl& m, std::span<const SeqChunk> chunks, const StepShape& shape, bool all_rows,
                     std::span<const kernels::SampleParams> sampling, int64_t* rows) {
  DSV4_RETURN_IF_ERROR(ValidateChunks(m, chunks, shape));
  if (sampling.size() > chunks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("step has ", sampling.size(), " sampling rows for ", chunks.size(),
                                                   " chunks"));
  }
  m.tp_status = absl::OkStatus();
  *rows = PackPlan(m, chunks, shape, all_rows, sampling);
  DSV4_RETURN_IF_ERROR(m.backend->CopyToDevice(m.ws.plan.data(), m.ws.plan_host.data(), m.plan.total * 4));
  for (const SeqChunk& ch : chunks) m.cache->next_pos(ch.tables->state_slot) += static_cast<int64_t>(ch.tokens.size());
  return absl::OkStatus();
}

// Enqueues the embedding and every layer; returns the residual streams the head reads.
const float* EnqueueLayers(Dsv4Model::Impl& m, const StepContext& s) {
  const Config& c = m.config;
  m.BeginPhase(Phase::kDense);  // the embedding lookup: every stream starts as the embedding
  float* x = m.ws.x[0].as<float>();
  float* x_next = m.ws.x[1].as<float>();
  s.ops.Embed({.table = m.weights->embed.get(), .tokens = s.tokens, .pos = s.step.pos, .x = x, .t = s.step.t,
               .s = c.hc_mult});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    AttentionSublayer(m, s, l, x, x_next);
    std::swap(x, x_next);
    FfnSublayer(m, s, l, x, x_next);
    std::swap(x, x_next);
  }
  return x;
}

// Tensor parallel: waits for the step's collectives within the group's deadline before anything is copied to the
// host (a copy would wait for a dead peer forever). Keeps the first failure in tp_status and returns it.
absl::Status FlushCollectives(Dsv4Model::Impl& m) {
  if (m.options.collectives == nullptr || m.options.collectives->world() == 1 || !m.tp_status.ok()) return m.tp_status;
  m.tp_status = m.options.collectives->Flush();
  return m.tp_status;
}

// The eager forward of Forward / ForwardAllLogits: the head in passes of at most ws.head_rows rows, each pass's
// logits back with one copy (a decode or prefill step of <= head_rows chunks is one pass).
absl::Status RunForward(Dsv4Model::Impl& m, std::span<const SeqChunk> chunks, bool all_rows, float* out) {
  if (chunks.empty()) return absl::InvalidArgumentError("Forward with no chunks");
  const StepShape shape = Dsv4Model::ShapeOf(chunks);
  int64_t rows = 0;
  DSV4_RETURN_IF_ERROR(Prepare(m, chunks, shape, all_rows, {}, &rows));
  const StepContext s = MakeStepContext(m, shape);
  const float* x = EnqueueLayers(m, s);
  kernels::Backend& be = *m.backend;
  const int64_t V = m.config.vocab_size;
  float* logits = (m.shard != nullptr ? m.ws.logits_full : m.ws.logits).as<float>();
  const int32_t* head_rows = m.ws.plan.as<const int32_t>() + m.plan.head_rows;
  for (int64_t r0 = 0; r0 < rows; r0 += m.ws.head_rows) {
    const int64_t r = std::min(m.ws.head_rows, rows - r0);
    Head(m, s, x, head_rows + r0, r, logits);
    DSV4_RETURN_IF_ERROR(FlushCollectives(m));
    DSV4_RETURN_IF_ERROR(be.CopyToHost(out + r0 * V, logits, r * V * 4));
  }
  if (m.options.phase_hook != nullptr) m.options.phase_hook->End();
  DSV4_RETURN_IF_ERROR(be.Synchronize());
  return m.tp_status;
}

}  // namespace

StepShape Dsv4Model::ShapeOf(std::span<const SeqChunk> chunks) {
  StepShape shape{.tokens = 0, .seqs = static_cast<int64_t>(chunks.size()), .max_seq_len = 1};
  for (const SeqChunk& ch : chunks) {
    shape.tokens += static_cast<int64_t>(ch.tokens.size());
    shape.max_seq_len = std::max(shape.max_seq_len, static_cast<int>(ch.tokens.size()));
  }
  return shape;
}

int64_t Dsv4Model::max_step_tokens() const { return impl_->ws.max_tokens; }
int64_t Dsv4Model::max_step_seqs() const { return impl_->ws.max_seqs; }
int64_t Dsv4Model::max_head_rows() const { return impl_->ws.head_rows; }

absl::Status Dsv4Model::PrepareStep(std::span<const SeqChunk> chunks, const StepShape& shape,
                                     std::span<const kernels::SampleParams> sampling) {
  int64_t rows = 0;
  return Prepare(*impl_, chunks, shape, false, sampling, &rows);
}

absl::Status Dsv4Model::EnqueueStep(const StepShape& shape, bool sample) {
  Impl& m = *impl_;
  if (!m.cache->allocated()) return absl::FailedPreconditionError("EnqueueStep before AllocateCache");
  if (shape.tokens > m.ws.max_tokens || shape.seqs > m.ws.max_seqs || shape.seqs > m.ws.head_rows ||
      shape.seqs < 1 || shape.tokens < shape.seqs || shape.max_seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("EnqueueStep: shape of ", shape.tokens, " tokens, ", shape.seqs,
                                                   " sequences does not fit the workspace (", m.ws.max_tokens,
                                                   " tokens, ", m.ws.max_seqs, " sequences)"));
  }
  const StepContext s = MakeStepContext(m, shape);
  const float* x = EnqueueLayers(m, s);
  float* logits = (m.shard != nullptr ? m.ws.logits_full : m.ws.logits).as<float>();
  Head(m, s, x, m.ws.plan.as<const int32_t>() + m.plan.head_rows, shape.seqs, logits);
  if (sample) {  // one token per row from the whole vocabulary (every rank of a group has the gathered rows)
    s.ops.Sample({.logits = logits,
                  .params = reinterpret_cast<const kernels::SampleParams*>(m.ws.plan.as<const int32_t>() +
                                                                           m.plan.sample),
                  .tokens = m.ws.sampled.as<int32_t>(), .r = shape.seqs, .v = m.config.vocab_size});
  }
  if (m.options.phase_hook != nullptr) m.options.phase_hook->End();
  return absl::OkStatus();
}

absl::Status Dsv4Model::FinishStep(float* logits, int64_t rows) {
  Impl& m = *impl_;
  if (rows < 0 || rows > m.ws.head_rows) {
    return absl::InvalidArgumentError(absl::StrCat("FinishStep: ", rows, " logit rows out of [0, ", m.ws.head_rows, "]"));
  }
  if (rows > 0 && logits == nullptr) return absl::InvalidArgumentError("FinishStep: logits is null");
  kernels::Backend& be = *m.backend;
  DSV4_RETURN_IF_ERROR(FlushCollectives(m));
  const float* device = (m.shard != nullptr ? m.ws.logits_full : m.ws.logits).as<const float>();
  DSV4_RETURN_IF_ERROR(be.CopyToHost(logits, device, rows * m.config.vocab_size * 4));
  DSV4_RETURN_IF_ERROR(be.Synchronize());
  return m.tp_status;
}

absl::Status Dsv4Model::FinishStepTokens(int32_t* tokens, int64_t rows) {
  Impl& m = *impl_;
  if (rows < 0 || rows > m.ws.head_rows) {
    return absl::InvalidArgumentError(absl::StrCat("FinishStepTokens: ", rows, " rows out of [0, ", m.ws.head_rows,
                                                   "]"));
  }
  if (rows > 0 && tokens == nullptr) return absl::InvalidArgumentError("FinishStepTokens: tokens is null");
  DSV4_RETURN_IF_ERROR(FlushCollectives(m));
  DSV4_RETURN_IF_ERROR(m.backend->CopyToHost(tokens, m.ws.sampled.data(), rows * 4));
  DSV4_RETURN_IF_ERROR(m.backend->Synchronize());
  return m.tp_status;
}

absl::Status Dsv4Model::CopyLogitRows(std::span<const int> rows, float* out) {
  Impl& m = *impl_;
  if (!rows.empty() && out == nullptr) return absl::InvalidArgumentError("CopyLogitRows: out is null");
  const int64_t v = m.config.vocab_size;
  const float* device = (m.shard != nullptr ? m.ws.logits_full : m.ws.logits).as<const float>();
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] < 0 || rows[j] >= m.ws.head_rows) {
      return absl::InvalidArgumentError(absl::StrCat("CopyLogitRows: row ", rows[j], " out of [0, ", m.ws.head_rows,
                                                     ")"));
    }
    DSV4_RETURN_IF_ERROR(m.backend->CopyToHost(out + j * v, device + rows[j] * v, v * 4));
  }
  return m.backend->Synchronize();
}

absl::Status Dsv4Model::Forward(std::span<const SeqChunk> chunks, float* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("Forward: logits is null");
  return RunForward(*impl_, chunks, false, logits);
}

absl::Status Dsv4Model::ForwardAllLogits(std::span<const SeqChunk> chunks, std::vector<float>* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("ForwardAllLogits: logits is null");
  size_t total = 0;
  for (const SeqChunk& ch : chunks) total += ch.tokens.size();
  logits->resize(total * static_cast<size_t>(impl_->config.vocab_size));
  return RunForward(*impl_, chunks, true, logits->data());
}

}  // namespace dsv4::model
