// See kv_manager.h.
#include "worker/kv_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace dsv4::worker {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::array<int64_t, kNumPools> PagesForWith(const ModelExecutor& ex, const KvSizing& s, int64_t positions) {
  std::array<int64_t, kNumPools> out{};
  for (int p = 0; p < kNumPools; ++p) {
    if (s.page_bytes[p] == 0) continue;
    out[p] = CeilDiv(ex.RowsNeeded(static_cast<Pool>(p), positions), s.page_rows);
  }
  return out;
}

std::array<PageAllocator, kNumPools> MakePools(const KvSizing& s) {
  return {PageAllocator(s.pages[0]), PageAllocator(s.pages[1]), PageAllocator(s.pages[2]),
          PageAllocator(s.pages[3])};
}

}  // namespace

PageAllocator::PageAllocator(int64_t num_pages) : in_use_(num_pages, 0) {
  free_.reserve(num_pages);
  for (int64_t i = num_pages - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

bool PageAllocator::Allocate(int64_t n, std::vector<int32_t>* out) {
  if (n > free_pages()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t page = free_.back();
    free_.pop_back();
    in_use_[page] = 1;
    out->push_back(page);
  }
  return true;
}

void PageAllocator::Free(std::span<const int32_t> pages) {
  for (int32_t page : pages) {
    if (page < 0 || page >= total() || !in_use_[page]) {
      std::fprintf(stderr, "page allocator: free of page %d that is not in use (total %lld)\n", page,
                   static_cast<long long>(total()));
      std::abort();  // an ownership bug: continuing would hand one page to two requests
    }
    in_use_[page] = 0;
    free_.push_back(page);
  }
}

int64_t KvSizing::total_bytes() const {
  int64_t total = 0;
  for (int p = 0; p < kNumPools; ++p) total += pages[p] * page_bytes[p];
  return total;
}

std::string KvSizing::ToString() const {
  std::string out = absl::StrCat("page_rows=", page_rows, " slots=", max_slots);
  for (int p = 0; p < kNumPools; ++p) {
    absl::StrAppend(&out, " ", kPoolNames[p], "=", pages[p], "x", page_bytes[p], "B");
  }
  absl::StrAppend(&out, absl::StrFormat(" total=%.1fMiB", total_bytes() / 1048576.0));
  return out;
}

absl::StatusOr<KvSizing> PlanKvSizing(const ModelExecutor& ex, const KvSizingRequest& r) {
  if (r.page_rows < 1) return absl::InvalidArgumentError(absl::StrCat("--page-rows ", r.page_rows, " must be >= 1"));
  KvSizing s;
  s.page_rows = r.page_rows;
  s.max_slots = r.max_batch;
  for (int p = 0; p < kNumPools; ++p) s.page_bytes[p] = ex.PageBytes(static_cast<Pool>(p), r.page_rows);
  const std::array<int64_t, kNumPools> one = PagesForWith(ex, s, r.max_context);
  std::array<int64_t, kNumPools> all{};
  for (int p = 0; p < kNumPools; ++p) all[p] = one[p] * r.max_batch;
  // Every running request holds exactly one window ring, from its first token to its end: size that pool for
  // max_batch rings, so page pressure (and preemption) only ever comes from the growing pools.
  const int kWindow = static_cast<int>(Pool::kWindow);
  s.pages[kWindow] = all[kWindow];
  if (r.kv_pages > 0) {
    for (int p = 0; p < kNumPools; ++p) {
      if (s.page_bytes[p] == 0 || p == kWindow) continue;
      if (r.kv_pages < one[p]) {
        return absl::InvalidArgumentError(absl::StrCat("--kv-pages ", r.kv_pages, " is less than the ", one[p],
                                                       " pages the ", kPoolNames[p],
                                                       " pool needs for one request of --max-context ",
                                                       r.max_context));
      }
      s.pages[p] = std::min(r.kv_pages, all[p]);
    }
    return s;
  }
  if (!(r.mem_fraction > 0 && r.mem_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mem-fraction ", r.mem_fraction, " must lie in (0, 1] when --kv-pages is 0"));
  }
  int64_t one_growing = 0, all_growing = 0;
  for (int p = 0; p < kNumPools; ++p) {
    if (p == kWindow) continue;
    one_growing += one[p] * s.page_bytes[p];
    all_growing += all[p] * s.page_bytes[p];
  }
  const double window_bytes = static_cast<double>(all[kWindow] * s.page_bytes[kWindow]);
  const double budget = r.mem_fraction * static_cast<double>(r.available_bytes);
  if (budget < window_bytes + static_cast<double>(one_growing)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--mem-fraction %g gives %.1f MiB for KV pools, less than the %.1f MiB that --max-batch %d windows plus "
        "one request of --max-context %d need",
        r.mem_fraction, budget / 1048576.0, (window_bytes + one_growing) / 1048576.0, r.max_batch,
        r.max_context));
  }
  // Scale every growing pool by the same factor, so they run out at about the same load.
  const double scale =
      all_growing > 0 ? std::min(1.0, (budget - window_bytes) / static_cast<double>(all_growing)) : 1.0;
  for (int p = 0; p < kNumPools; ++p) {
    if (p != kWindow) s.pages[p] = std::max(one[p], static_cast<int64_t>(static_cast<double>(all[p]) * scale));
  }
  return s;
}

KvSizing MinimalKvSizing(const ModelExecutor& ex, const KvSizingRequest& r) {
  KvSizing s;
  s.page_rows = r.page_rows;
  s.max_slots = r.max_batch;
  for (int p = 0; p < kNumPools; ++p) s.page_bytes[p] = ex.PageBytes(static_cast<Pool>(p), r.page_rows);
  s.pages = PagesForWith(ex, s, r.max_context);
  const int kWindow = static_cast<int>(Pool::kWindow);
  s.pages[kWindow] *= r.max_batch;
  return s;
}

int64_t MaxSequencesAt(const ModelExecutor& ex, const KvSizing& s, int64_t positions) {
  const std::array<int64_t, kNumPools> one = PagesForWith(ex, s, positions);
  int64_t most = s.max_slots;
  for (int p = 0; p < kNumPools; ++p) {
    if (one[p] > 0) most = std::min(most, s.pages[p] / one[p]);
  }
  return most;
}

KvManager::KvManager(const ModelExecutor& executor, const KvSizing& sizing)
    : executor_(executor), sizing_(sizing), pools_(MakePools(sizing)) {
  for (int i = sizing.max_slots - 1; i >= 0; --i) free_slots_.push_back(i);
}

std::array<int64_t, kNumPools> KvManager::PagesFor(int64_t num_positions) const {
  return PagesForWith(executor_, sizing_, num_positions);
}

std::array<int64_t, kNumPools> KvManager::MissingPages(const BlockTables& t, int64_t num_positions) const {
  std::array<int64_t, kNumPools> need = PagesFor(num_positions);
  for (int p = 0; p < kNumPools; ++p) {
    need[p] = std::max<int64_t>(0, need[p] - static_cast<int64_t>(t.pages[p].size()));
  }
  return need;
}

bool KvManager::CanReserve(const BlockTables& t, int64_t num_positions) const {
  const auto need = MissingPages(t, num_positions);
  for (int p = 0; p < kNumPools; ++p) {
    if (need[p] > pools_[p].free_pages()) return false;
  }
  return true;
}

bool KvManager::CanReserveWithHeadroom(const BlockTables& t, int64_t num_positions, int64_t headroom) const {
  const auto need = MissingPages(t, num_positions);
  for (int p = 0; p < kNumPools; ++p) {
    const int64_t extra = p == static_cast<int>(Pool::kWindow) || pools_[p].total() == 0 ? 0 : headroom;
    if (need[p] + extra > pools_[p].free_pages()) return false;
  }
  return true;
}

bool KvManager::Reserve(BlockTables* t, int64_t num_positions) {
  if (!CanReserve(*t, num_positions)) return false;
  const auto need = MissingPages(*t, num_positions);
  for (int p = 0; p < kNumPools; ++p) pools_[p].Allocate(need[p], &t->pages[p]);
  return true;
}

bool KvManager::AcquireSlot(BlockTables* t) {
  if (t->state_slot >= 0) return true;
  if (free_slots_.empty()) return false;
  t->state_slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

void KvManager::Release(BlockTables* t) {
  for (int p = 0; p < kNumPools; ++p) {
    pools_[p].Free(t->pages[p]);
    t->pages[p].clear();
  }
  if (t->state_slot >= 0) free_slots_.push_back(t->state_slot);
  t->state_slot = -1;
}

std::array<PoolUsage, kNumPools> KvManager::Usage() const {
  std::array<PoolUsage, kNumPools> u;
  for (int p = 0; p < kNumPools; ++p) u[p] = {pools_[p].used(), pools_[p].total()};
  return u;
}

double KvManager::UsageRatio() const {
  double ratio = 0;
  for (const auto& pool : pools_) {
    if (pool.total() > 0) ratio = std::max(ratio, static_cast<double>(pool.used()) / pool.total());
  }
  return ratio;
}

}  // namespace dsv4::worker
