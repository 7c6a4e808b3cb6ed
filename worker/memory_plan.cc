// PlanMemory: see memory_plan.h.
#include "worker/memory_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace dsv4::worker {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%10.1f MiB", bytes / 1048576.0); }

std::string PoolsLine(const KvSizing& s) {
  std::string out;
  for (int p = 0; p < kNumPools; ++p) {
    if (s.pages[p] == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", kPoolNames[p], " ", s.pages[p], " x ",
                    absl::StrFormat("%.1f KiB", s.page_bytes[p] / 1024.0));
  }
  return absl::StrCat(out, "; ", s.page_rows, "-row pages");
}

// The table's lines shared by both backends.
std::string Table(const ExecutorMemory& m, const MemoryPlan& plan, const MemoryPlanRequest& r) {
  std::string t;
  absl::StrAppend(&t, "  weights                  ", MiB(m.weights), "\n");
  absl::StrAppend(&t, "  workspace + op scratch   ", MiB(m.workspace), "\n");
  absl::StrAppend(&t, "  compressor state         ", MiB(m.state), "  (", plan.sizing.max_slots, " slots)\n");
  absl::StrAppend(&t, "  KV pools                 ", MiB(m.kv_cache), "  (", PoolsLine(plan.sizing), ")\n");
  return t;
}

std::string SeqsLine(const ExecutorMemory&, const ModelExecutor& ex, const MemoryPlan& plan,
                     const MemoryPlanRequest& r) {
  KvSizing uncapped = plan.sizing;
  uncapped.max_slots = 1 << 30;
  uncapped.page_bytes[static_cast<int>(Pool::kWindow)] = 0;  // the window pool is sized for --max-batch exactly
  return absl::StrCat("  max concurrent sequences at --max-context ", r.kv.max_context, ": ", plan.max_context_seqs,
                      " (the growing pools hold ", MaxSequencesAt(ex, uncapped, r.kv.max_context),
                      ", --max-batch ", r.kv.max_batch, ")");
}

absl::StatusOr<MemoryPlan> PlanHost(ModelExecutor& ex, const MemoryPlanRequest& r) {
  MemoryPlan plan;
  DSV4_ASSIGN_OR_RETURN(plan.sizing, PlanKvSizing(ex, r.kv));
  DSV4_RETURN_IF_ERROR(ex.AllocateCache(plan.sizing.pages, plan.sizing.page_rows, plan.sizing.max_slots));
  DSV4_ASSIGN_OR_RETURN(plan.graphs, ex.CaptureGraphs(r.graph_buckets, r.capture_graphs));
  plan.budget_bytes = static_cast<int64_t>(r.kv.mem_fraction * static_cast<double>(r.kv.available_bytes));
  plan.max_context_seqs = MaxSequencesAt(ex, plan.sizing, r.kv.max_context);
  const ExecutorMemory m = ex.Memory();
  plan.table = absl::StrCat("memory plan of ", m.backend.empty() ? "the backend" : m.backend, " (host memory; pools: ",
                            r.kv.kv_pages > 0 ? absl::StrCat("--kv-pages ", r.kv.kv_pages)
                                              : absl::StrFormat("--mem-fraction %g of %.1f MiB available",
                                                                r.kv.mem_fraction, r.kv.available_bytes / 1048576.0),
                            ")\n", Table(m, plan, r), SeqsLine(m, ex, plan, r));
  return plan;
}

absl::StatusOr<MemoryPlan> PlanDevice(ModelExecutor& ex, const MemoryPlanRequest& r, const ExecutorMemory& loaded) {
  if (!(r.gpu_memory_fraction > 0 && r.gpu_memory_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-fraction ", r.gpu_memory_fraction,
                                                   " must lie in (0, 1]"));
  }
  MemoryPlan plan;
  plan.budget_bytes = static_cast<int64_t>(r.gpu_memory_fraction * static_cast<double>(loaded.device_total));
  // 1. The minimal cache brings the workspace and scratch: what is used now is all but the pools' growth.
  const KvSizing minimal = MinimalKvSizing(ex, r.kv);
  if (absl::Status s = ex.AllocateCache(minimal.pages, minimal.page_rows, minimal.max_slots); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("allocating the workspace and one request of --max-context ",
                                               r.kv.max_context, " (", minimal.ToString(), "): ", s.message()));
  }
  const ExecutorMemory probe = ex.Memory();
  const int64_t used_without_pools = (probe.device_total - probe.device_free) - probe.kv_cache;
  const int64_t graphs = r.capture_graphs ? static_cast<int64_t>(r.graph_buckets.size()) : 0;
  const int64_t graph_reserve = r.graph_reserve_per_bucket * graphs;
  // 2. The pools' budget: the fraction's rest, and never more than the device has free.
  const int64_t by_fraction = plan.budget_bytes - used_without_pools - graph_reserve;
  const int64_t by_free = probe.device_free + probe.kv_cache - graph_reserve;
  const int64_t pools_budget = std::min(by_fraction, by_free);
  DSV4_LOG_INFO("device memory before the pools: {:.1f} MiB used of {:.1f} MiB (weights {:.1f}, workspace {:.1f}, "
                "state {:.1f}); budget {:.1f} MiB; graph reserve {:.1f} MiB; pools get {:.1f} MiB",
                used_without_pools / 1048576.0, probe.device_total / 1048576.0, probe.weights / 1048576.0,
                probe.workspace / 1048576.0, probe.state / 1048576.0, plan.budget_bytes / 1048576.0,
                graph_reserve / 1048576.0, pools_budget / 1048576.0);
  // 3. Size and allocate the pools. The least they may be: --max-batch windows and one request of --max-context.
  if (r.kv.kv_pages == 0 && pools_budget < minimal.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--gpu-memory-fraction %g of %.1f MiB leaves %.1f MiB for KV pools after %.1f MiB of weights, workspace and "
        "CUDA context and %.1f MiB reserved for %d graphs; --max-batch %d windows plus one request of --max-context "
        "%d need %.1f MiB (raise the fraction, or lower --max-batch / --max-context)",
        r.gpu_memory_fraction, loaded.device_total / 1048576.0, pools_budget / 1048576.0,
        used_without_pools / 1048576.0, graph_reserve / 1048576.0, static_cast<int>(graphs),
        r.kv.max_batch, static_cast<int>(r.kv.max_context), minimal.total_bytes() / 1048576.0));
  }
  KvSizingRequest kv = r.kv;
  kv.mem_fraction = 1.0;
  kv.available_bytes = std::max<int64_t>(0, pools_budget);
  DSV4_ASSIGN_OR_RETURN(plan.sizing, PlanKvSizing(ex, kv));
  DSV4_RETURN_IF_ERROR(ex.AllocateCache(plan.sizing.pages, plan.sizing.page_rows, plan.sizing.max_slots));
  // 4. The graphs, last: they record the final addresses.
  DSV4_ASSIGN_OR_RETURN(plan.graphs, ex.CaptureGraphs(r.graph_buckets, r.capture_graphs));
  if (plan.graphs.device_bytes > graph_reserve) {
    DSV4_LOG_WARN("CUDA graphs took {:.1f} MiB, more than the {:.1f} MiB reserved for them: the worker uses that much "
                  "beyond --gpu-memory-fraction", plan.graphs.device_bytes / 1048576.0, graph_reserve / 1048576.0);
  }
  plan.max_context_seqs = MaxSequencesAt(ex, plan.sizing, r.kv.max_context);
  const ExecutorMemory m = ex.Memory();
  const int64_t used = m.device_total - m.device_free;
  const int64_t other = used - m.weights - m.workspace - m.state - m.kv_cache - plan.graphs.device_bytes;
  plan.table = absl::StrCat(
      "memory plan of ", m.backend, absl::StrFormat(": budget %.1f MiB = --gpu-memory-fraction %g x %.1f MiB\n",
                                                    plan.budget_bytes / 1048576.0, r.gpu_memory_fraction,
                                                    m.device_total / 1048576.0),
      Table(m, plan, r),
      "  CUDA graphs              ", MiB(plan.graphs.device_bytes), "  (", plan.graphs.buckets.size(),
      " buckets, measured; ", absl::StrFormat("%.1f", graph_reserve / 1048576.0), " MiB reserved)\n",
      "  other on the device      ", MiB(other), "  (CUDA context, NCCL, other processes)\n",
      "  left in the budget       ", MiB(plan.budget_bytes - used), "\n",
      "  pinned host staging      ", MiB(m.host_staging), "  (host memory)\n", SeqsLine(m, ex, plan, r));
  return plan;
}

}  // namespace

std::string GraphCaptureReport::ToString() const {
  std::string out = absl::StrFormat("%d graphs in %.3f s", buckets.size(), seconds);
  if (device_bytes > 0) absl::StrAppend(&out, absl::StrFormat(", %.1f MiB of device memory", device_bytes / 1048576.0));
  for (const Bucket& b : buckets) {
    absl::StrAppend(&out, absl::StrFormat("; bucket %d: %.1f ms (warm-up %.1f ms), %d nodes", b.bucket,
                                          b.capture_seconds * 1e3, b.warm_up_seconds * 1e3, b.nodes));
  }
  return out;
}

absl::StatusOr<MemoryPlan> PlanMemory(ModelExecutor& ex, const MemoryPlanRequest& r) {
  const ExecutorMemory loaded = ex.Memory();
  absl::StatusOr<MemoryPlan> plan = loaded.device ? PlanDevice(ex, r, loaded) : PlanHost(ex, r);
  if (plan.ok()) DSV4_LOG_INFO("{}", plan->table);
  return plan;
}

}  // namespace dsv4::worker
