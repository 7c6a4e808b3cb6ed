// Cost model and choice of the 8-warp MMA kernel's work partition (see sparse_mla_partition.h).
#include "kernels/sparse_mla/sparse_mla_partition.h"

#include <algorithm>
#include <cstdint>

namespace dsv4::kernels::sparse_mla {

double MmaPartitionCost(const MmaPartition& m) {
  const int64_t T = m.tiles_per_seq;
  double worst = 0.0;
  bool any_split = false;
  for (int i = 0; i < m.parts; ++i) {
    const int64_t begin = m.Begin(i), end = m.Begin(i + 1);
    if (end == begin) continue;
    const int64_t first_seq = begin / T, last_seq = (end - 1) / T;
    // A part that starts or ends inside a sequence shares it with a neighbour.
    any_split = any_split || begin % T != 0 || end % T != 0;
    worst = std::max(worst, static_cast<double>(end - begin) + kSegmentCost * static_cast<double>(last_seq - first_seq));
  }
  return worst + (any_split ? kMergeCost : 0.0);
}

MmaPartition ChooseMmaPartition(int batch, int tiles_per_seq, int max_parts) {
  const int B = std::max(batch, 1), T = std::max(tiles_per_seq, 1), cap = std::max(max_parts, 1);
  MmaPartition best = MmaPartition::Of(B, T, std::min(B, cap));
  double best_cost = MmaPartitionCost(best);
  auto consider = [&](int parts) {
    const MmaPartition candidate = MmaPartition::Of(B, T, parts);
    const double cost = MmaPartitionCost(candidate);
    if (cost < best_cost - 1e-9 || (cost < best_cost + 1e-9 && parts < best.parts)) {
      best = candidate;
      best_cost = cost;
    }
  };
  for (int k = 2; k <= T && static_cast<int64_t>(k) * B <= cap; ++k) consider(k * B);
  if (B > cap) {  // whole sequences per part: B = 128 on 66 parts (H = 128) as 64 parts of two sequences
    const int per_part = (B + cap - 1) / cap;
    consider((B + per_part - 1) / per_part);
  }
  consider(cap);
  return best;
}

}  // namespace dsv4::kernels::sparse_mla
