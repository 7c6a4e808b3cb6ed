// Paged KV pools, host side: one page allocator per pool (dsv4-decode.md section 3.2) and the per-request block
// tables and compressor-state slots. The executor owns the memory the pages name; this file only decides which
// request owns which page id. Sizes are fixed at start-up (PlanKvSizing) and logged.
//
// A request's pages are reserved all-or-nothing across pools (Reserve either grows every pool's table or none),
// so a failed reservation never leaks pages; Release returns every page and the slot.
//
// Threads: owned by the engine thread; not thread-safe. Usage snapshots are copied out by the engine.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model_executor.h"

namespace dsv4::worker {

// A free list of page ids [0, num_pages). Double frees and frees of unknown ids are bugs: they abort.
class PageAllocator {
 public:
  explicit PageAllocator(int64_t num_pages);
  int64_t total() const { return static_cast<int64_t>(in_use_.size()); }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used() const { return total() - free_pages(); }
  // Appends n page ids to *out, or returns false and changes nothing.
  bool Allocate(int64_t n, std::vector<int32_t>* out);
  void Free(std::span<const int32_t> pages);

 private:
  std::vector<int32_t> free_;    // LIFO, so recently freed (cache-warm) pages are reused first
  std::vector<uint8_t> in_use_;  // per page id
};

struct KvSizing {
  std::array<int64_t, kNumPools> pages{};       // per pool; 0 for pools no layer uses
  std::array<int64_t, kNumPools> page_bytes{};  // per pool, summed over layers
  int page_rows = 0;
  int max_slots = 0;  // compressor-state slots = max running requests
  int64_t total_bytes() const;
  std::string ToString() const;
};

struct KvSizingRequest {
  int page_rows = 64;
  int max_batch = 32;
  int64_t max_context = 4096;
  // > 0: pages in each growing pool (compressed4, compressed128, indexer), capped at what max_batch requests of
  // max_context use. The window pool always holds max_batch rings.
  int64_t kv_pages = 0;
  double mem_fraction = 0;       // used when kv_pages == 0: share of available_bytes for all pools
  int64_t available_bytes = 0;   // memory the pools may take from (free host or device memory)
};

// Pages per pool from the flags. Errors (INVALID_ARGUMENT, naming the flag) when even one request of
// max_context would not fit, because then the scheduler could never make progress.
absl::StatusOr<KvSizing> PlanKvSizing(const ModelExecutor& executor, const KvSizingRequest& request);

// The smallest sizing PlanKvSizing could return: --max-batch window rings and one request of --max-context in every
// growing pool (a device worker allocates it first, to measure everything the pools do not take).
KvSizing MinimalKvSizing(const ModelExecutor& executor, const KvSizingRequest& request);

// How many sequences of `positions` tokens the pools hold at once (the tightest pool decides), at most max_slots.
int64_t MaxSequencesAt(const ModelExecutor& executor, const KvSizing& sizing, int64_t positions);

struct PoolUsage {
  int64_t used = 0;
  int64_t total = 0;
};

class KvManager {
 public:
  KvManager(const ModelExecutor& executor, const KvSizing& sizing);

  // Pages of each pool a sequence holding num_positions tokens needs.
  std::array<int64_t, kNumPools> PagesFor(int64_t num_positions) const;
  // Extra pages beyond what `tables` holds to cache num_positions tokens, per pool.
  std::array<int64_t, kNumPools> MissingPages(const BlockTables& tables, int64_t num_positions) const;
  bool CanReserve(const BlockTables& tables, int64_t num_positions) const;
  // CanReserve, leaving at least headroom_pages free in every growing pool afterwards (admission uses it so
  // that running requests can grow a little before anyone must be preempted).
  bool CanReserveWithHeadroom(const BlockTables& tables, int64_t num_positions, int64_t headroom_pages) const;
  // Grows the tables to cover num_positions tokens (all pools or none). False when pages are short.
  bool Reserve(BlockTables* tables, int64_t num_positions);
  // Takes a compressor-state slot; false when all are taken.
  bool AcquireSlot(BlockTables* tables);
  // Returns every page and the slot; the tables end empty.
  void Release(BlockTables* tables);

  std::array<PoolUsage, kNumPools> Usage() const;
  double UsageRatio() const;  // max over used pools of used/total
  int free_slots() const { return static_cast<int>(free_slots_.size()); }
  const KvSizing& sizing() const { return sizing_; }

 private:
  const ModelExecutor& executor_;
  KvSizing sizing_;
  std::array<PageAllocator, kNumPools> pools_;
  std::vector<int32_t> free_slots_;
};

}  // namespace dsv4::worker
