// The sampling kernel (contract: sample_params.h; host side: sample.cc). One block per row draws exactly the
// CPU reference's token (kernels/cpu/cpu_sample.cc) with the same arithmetic (kernels/sample_math.h):
//  1. a block reduction gives the max logit with its lowest id and whether a NaN is present (greedy rows end);
//  2. top-k, then top-p, find their cut - the rank key of the last token kept - by a radix select over the
//     logits' order keys (levels of 11, 11 and 10 bits; a shared-memory histogram of counts for top-k, of counts
//     and integer weights for top-p, one scan of it by warp 0), and then resolve the tie group of the selected
//     logit by id (FindCrossing: the first member whose rank satisfies the rule);
//  3. the survivors' weights are summed per 512-token segment, the draw's target comes from the exact total, and
//     FindCrossing locates the first token whose running sum exceeds it.
// Every sum is a uint64 of integer weights, so no order of addition (atomics included) can change a decision.
// Nothing is allocated and the launch depends on R only, so the op can be captured in a graph. The row is re-read
// from global memory (L2) by each pass: at most 1 + 4 + 4 + 1 passes for top-k + top-p.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/pdl.h"
#include "kernels/cuda/sample_params.h"
#include "kernels/sample_math.h"

namespace dsv4::kernels::cuda {
namespace {

namespace s = ::dsv4::kernels::sample;
using u64 = unsigned long long;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kDigits = 2048;                                   // 11-bit radix digits
constexpr int kSegment = kThreads;                              // tokens per segment of FindCrossing
constexpr int kMaxSegments = s::kMaxVocab / kSegment;           // 1024
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kNoDigit = 0xffffffffu;
// Written instead of a token when a cut or the draw finds nothing, which the algorithm rules out: a distinct
// value, so a test names the failure instead of reporting a plausible token.
constexpr int32_t kNotFound = -2;

static_assert(kMaxSegments <= 32 * 32, "FindCrossing's segment scan gives each lane at most 32 segments");

struct Shared {
  uint32_t count[kDigits];
  u64 weight[kDigits];
  u64 seg_total[kMaxSegments];
  u64 warp_total[kWarps];
  float best_value[kWarps];
  int best_id[kWarps];
  // Broadcasts to the block, each written before a barrier and read after it.
  float max_logit;
  int argmax;
  uint32_t digit;
  u64 above;
  double top_p_target;
  u64 total;
  int seg;
  u64 seg_base;
  int warp;
  u64 warp_base;
  int found;
};

struct Row {
  const float* logits;
  int v;
  float max_logit, inv_t;
};

__device__ __forceinline__ float ProbOf(const Row& row, float logit) {
  return s::ExpNeg(s::ScaledLogit(logit, row.max_logit, row.inv_t));
}

__device__ __forceinline__ u64 WarpInclusiveScan(u64 v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

__device__ __forceinline__ u64 WarpSum(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// (value, id) pairs: the larger value wins, then the lower id.
__device__ __forceinline__ void KeepBetter(float& best, int& id, float other, int other_id) {
  if (other > best || (other == best && other_id < id)) {
    best = other;
    id = other_id;
  }
}

// Max over the non-NaN logits with its lowest id into sh.max_logit / sh.argmax (the argmax is 0 when logits[0]
// is NaN, as the CPU's scan gives). Returns whether the row has a NaN.
__device__ bool RowMax(const float* logits, int v, Shared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float best = -INFINITY;
  int id = INT_MAX;
  int nan = 0;
  for (int i = tid; i < v; i += kThreads) {
    const float l = logits[i];
    if (isnan(l)) {
      nan = 1;
    } else {
      KeepBetter(best, id, l, i);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(kFull, best, o);
    const int oi = __shfl_xor_sync(kFull, id, o);
    KeepBetter(best, id, ob, oi);
  }
  if (lane == 0) {
    sh.best_value[warp] = best;
    sh.best_id[warp] = id;
  }
  nan = __syncthreads_or(nan);
  if (warp == 0) {
    best = lane < kWarps ? sh.best_value[lane] : -INFINITY;
    id = lane < kWarps ? sh.best_id[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFull, best, o);
      const int oi = __shfl_xor_sync(kFull, id, o);
      KeepBetter(best, id, ob, oi);
    }
    if (lane == 0) {
      sh.max_logit = best;
      sh.argmax = isnan(logits[0]) ? 0 : id;
    }
  }
  __syncthreads();
  return nan != 0;
}

// Sum of value(i) over the row, and per segment of kSegment tokens into sh.seg_total. Every thread gets the total.
template <class Value>
__device__ u64 SegmentTotals(int v, const Value& value, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int segments = (v + kSegment - 1) / kSegment;
  for (int seg = warp; seg < segments; seg += kWarps) {
    const int end = min(v, (seg + 1) * kSegment);
    u64 sum = 0;
    for (int i = seg * kSegment + lane; i < end; i += 32) sum += value(i);
    sum = WarpSum(sum);
    if (lane == 0) sh.seg_total[seg] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    u64 sum = 0;
    for (int seg = lane; seg < segments; seg += 32) sum += sh.seg_total[seg];
    sum = WarpSum(sum);
    if (lane == 0) sh.total = sum;
  }
  __syncthreads();
  return sh.total;
}

// The first id i with value(i) > 0 and pred(value(0) + ... + value(i)), for a pred that is monotone in the
// running sum; -1 when there is none. Needs sh.seg_total from SegmentTotals of the same value. Warp 0 finds the
// segment (each lane owns 32 consecutive segments; the lane where the crossing falls walks them), then one token
// per thread finds the token inside it.
template <class Value, class Pred>
__device__ int FindCrossing(int v, const Value& value, const Pred& pred, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int segments = (v + kSegment - 1) / kSegment;
  if (warp == 0) {
    if (lane == 0) sh.seg = -1;
    __syncwarp();
    const int first = lane * 32;
    u64 lane_sum = 0;
    for (int t = 0; t < 32; ++t) {
      const int seg = first + ((t + lane) & 31);  // skewed: the lanes read different banks
      if (seg < segments) lane_sum += sh.seg_total[seg];
    }
    const u64 incl = WarpInclusiveScan(lane_sum, lane);
    const unsigned hit = __ballot_sync(kFull, lane_sum > 0 && pred(incl));
    if (hit != 0 && lane == __ffs(hit) - 1) {
      u64 run = incl - lane_sum;
      for (int seg = first; seg < first + 32 && seg < segments; ++seg) {
        const u64 val = sh.seg_total[seg];
        if (val > 0 && pred(run + val)) {
          sh.seg = seg;
          sh.seg_base = run;
          break;
        }
        run += val;
      }
    }
  }
  __syncthreads();
  const int seg = sh.seg;
  if (seg < 0) return -1;
  const int i = seg * kSegment + threadIdx.x;
  const u64 val = i < v ? value(i) : 0;
  const u64 incl = WarpInclusiveScan(val, lane);
  if (lane == 31) sh.warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const u64 t = lane < kWarps ? sh.warp_total[lane] : 0;
    const u64 warp_incl = sh.seg_base + WarpInclusiveScan(t, lane);
    const unsigned hit = __ballot_sync(kFull, t > 0 && pred(warp_incl));
    const int w = hit != 0 ? __ffs(hit) - 1 : -1;
    const u64 base = __shfl_sync(kFull, warp_incl - t, w >= 0 ? w : 0);
    if (lane == 0) {
      sh.warp = w;
      sh.warp_base = base;
      sh.found = -1;
    }
  }
  __syncthreads();
  if (warp == sh.warp) {
    const unsigned hit = __ballot_sync(kFull, val > 0 && pred(sh.warp_base + incl));
    if (lane == 0 && hit != 0) sh.found = seg * kSegment + warp * 32 + __ffs(hit) - 1;
  }
  __syncthreads();
  return sh.found;
}

// The cut of top-k (kWeights false: the k-th token of the rank order) or of top-p (kWeights true: the first token
// of the rank order where the running weight reaches top_p of the total), over the tokens whose rank key is
// >= floor. Radix select on the order key from the top bits down: each level histograms the tokens that match
// the digits chosen so far, and warp 0 picks the highest non-empty digit where the running count / weight
// (`above` holds what ranks before the digit) crosses. After the last level the order key is one logit value;
// its tie group ranks by id, and FindCrossing picks the member at which the rule holds. False if nothing
// crosses (ruled out by the algorithm).
template <bool kWeights>
__device__ bool SelectCut(const Row& row, u64 floor, u64 k, float top_p, Shared& sh, u64* cut) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0, mask = 0;
  u64 above = 0;
  double target = 0;  // top-p, in warp 0: top_p times the total weight, set at level 0
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
    const uint32_t digit_mask = level == 2 ? 0x3ffu : 0x7ffu;
    for (int d = tid; d < kDigits; d += kThreads) {
      sh.count[d] = 0;
      if (kWeights) sh.weight[d] = 0;
    }
    __syncthreads();
    // Histogram; a thread adds runs of equal digits at once (a concentrated row costs few atomics).
    int cur = -1;
    uint32_t c = 0;
    u64 w = 0;
    for (int i = tid; i < row.v; i += kThreads) {
      const float l = row.logits[i];
      const uint32_t key = s::OrderKey(l);
      if ((key & mask) != prefix || s::RankKey(key, i) < floor) continue;
      const int d = static_cast<int>((key >> shift) & digit_mask);
      if (d != cur) {
        if (cur >= 0) {
          atomicAdd(&sh.count[cur], c);
          if (kWeights) atomicAdd(&sh.weight[cur], w);
        }
        cur = d;
        c = 0;
        w = 0;
      }
      ++c;
      if (kWeights) w += s::Weight(ProbOf(row, l));
    }
    if (cur >= 0) {
      atomicAdd(&sh.count[cur], c);
      if (kWeights) atomicAdd(&sh.weight[cur], w);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane j owns digits [top - 63, top], walked from the top (the rank order is descending).
      const int top = kDigits - 1 - 64 * lane;
      uint32_t lane_count = 0;
      u64 lane_val = 0;
      for (int t = 0; t < 64; ++t) {
        const int d = top - ((t + lane) & 63);  // skewed: the lanes read different banks
        lane_count += sh.count[d];
        lane_val += kWeights ? sh.weight[d] : sh.count[d];
      }
      const u64 incl = WarpInclusiveScan(lane_val, lane);
      if (kWeights && level == 0) {
        target = s::TopPTarget(top_p, __shfl_sync(kFull, incl, 31));
        if (lane == 0) sh.top_p_target = target;
      }
      auto crosses = [&](u64 cumulative) {
        return kWeights ? s::TopPReached(cumulative, target) : cumulative >= k;
      };
      if (lane == 0) sh.digit = kNoDigit;
      __syncwarp();
      const unsigned hit = __ballot_sync(kFull, lane_count > 0 && crosses(above + incl));
      if (hit != 0 && lane == __ffs(hit) - 1) {
        u64 run = above + incl - lane_val;
        for (int t = 0; t < 64; ++t) {
          const int d = top - t;
          const u64 val = kWeights ? sh.weight[d] : sh.count[d];
          if (sh.count[d] > 0 && crosses(run + val)) {
            sh.digit = static_cast<uint32_t>(d);
            sh.above = run;
            break;
          }
          run += val;
        }
      }
    }
    __syncthreads();
    if (sh.digit == kNoDigit) return false;
    prefix |= sh.digit << shift;
    mask |= digit_mask << shift;
    above = sh.above;
  }
  // The tie group: tokens with order key `prefix` (and rank key >= floor), all of one logit and one weight.
  const uint32_t tie = prefix;
  auto member = [&](int i) -> u64 {
    const uint32_t key = s::OrderKey(row.logits[i]);
    return key == tie && s::RankKey(key, i) >= floor ? 1 : 0;
  };
  SegmentTotals(row.v, member, sh);
  int id = -1;
  if (kWeights) {
    const double t = sh.top_p_target;
    const u64 tie_weight = s::Weight(ProbOf(row, s::LogitOfKey(tie)));
    id = FindCrossing(row.v, member, [&](u64 rank) { return s::TopPReached(above + rank * tie_weight, t); }, sh);
  } else {
    const u64 need = k - above;
    id = FindCrossing(row.v, member, [&](u64 rank) { return rank >= need; }, sh);
  }
  if (id < 0) return false;
  *cut = s::RankKey(tie, id);
  return true;
}

__global__ void __launch_bounds__(kThreads, 1) SampleKernel(const SampleKernelParams p) {
  PdlEnter();
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const SampleParams q = p.params[r];
  if (!(q.temperature >= 0.0f)) {  // padding row
    if (threadIdx.x == 0) p.tokens[r] = -1;
    return;
  }
  const float* logits = p.logits + r * p.stride;
  const bool nan = RowMax(logits, p.v, sh);
  const float max_logit = sh.max_logit;
  const int argmax = sh.argmax;
  if (!(q.temperature > 0.0f) || q.top_k == 1 || nan || isinf(max_logit)) {
    if (threadIdx.x == 0) p.tokens[r] = argmax;
    return;
  }
  const Row row{.logits = logits, .v = p.v, .max_logit = max_logit, .inv_t = s::Div(1.0f, q.temperature)};
  u64 cut = 0;
  bool ok = true;
  if (q.top_k > 1 && q.top_k < p.v) ok = SelectCut<false>(row, 0, static_cast<u64>(q.top_k), 0.0f, sh, &cut);
  if (ok && q.top_p < 1.0f) ok = SelectCut<true>(row, cut, 0, q.top_p, sh, &cut);
  if (!ok) {
    if (threadIdx.x == 0) p.tokens[r] = kNotFound;
    return;
  }
  const bool min_p = q.min_p > 0.0f;
  auto weight = [&](int i) -> u64 {
    const float l = logits[i];
    if (s::RankKey(s::OrderKey(l), i) < cut) return 0;
    const float prob = ProbOf(row, l);
    if (min_p && !(prob >= q.min_p)) return 0;
    return s::Weight(prob);
  };
  const u64 total = SegmentTotals(p.v, weight, sh);
  if (total == 0) {  // min_p > 1 dropped even the top token
    if (threadIdx.x == 0) p.tokens[r] = argmax;
    return;
  }
  const u64 target = s::DrawTarget(s::RandomBits53(q.seed, q.index), total);
  const int id = FindCrossing(p.v, weight, [&](u64 cumulative) { return cumulative > target; }, sh);
  if (threadIdx.x == 0) p.tokens[r] = id >= 0 ? id : kNotFound;
}

}  // namespace

namespace internal {

cudaError_t LaunchSampleKernel(const SampleKernelParams& p, cudaStream_t stream) {
  return LaunchPdl(SampleKernel, dim3(static_cast<unsigned>(p.r)), dim3(kThreads), 0, stream, p);
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
