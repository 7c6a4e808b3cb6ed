#include "worker/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace dsv4::worker {
namespace {

// NaN counts as the least likely value: a broken logit never ranks, never poisons the others.
double Value(float v) { return std::isnan(v) ? -std::numeric_limits<double>::infinity() : static_cast<double>(v); }

}  // namespace

dsv4::v1::TokenLogprob TokenLogprobOf(std::span<const float> logits, int32_t token, int top) {
  dsv4::v1::TokenLogprob out;
  if (logits.empty() || token < 0 || static_cast<size_t>(token) >= logits.size()) {
    out.set_logprob(-std::numeric_limits<float>::infinity());
    return out;
  }
  // log Z over the finite part; +inf logits (a broken row) share all the mass among themselves.
  int64_t infinite = 0;
  double max = -std::numeric_limits<double>::infinity();
  for (float v : logits) {
    if (std::isinf(v) && v > 0) ++infinite;
    else if (std::isfinite(v)) max = std::max(max, static_cast<double>(v));
  }
  double sum = 0;
  if (infinite == 0 && std::isfinite(max)) {
    for (float v : logits) {
      if (std::isfinite(v)) sum += std::exp(static_cast<double>(v) - max);
    }
  }
  auto logprob = [&](float v) -> float {
    if (infinite > 0) {
      return std::isinf(v) && v > 0 ? static_cast<float>(-std::log(static_cast<double>(infinite)))
                                    : -std::numeric_limits<float>::infinity();
    }
    if (!std::isfinite(v) || !(sum > 0)) return -std::numeric_limits<float>::infinity();
    return static_cast<float>(static_cast<double>(v) - max - std::log(sum));
  };
  out.set_logprob(logprob(logits[token]));
  top = std::min<int>(std::max(top, 0), static_cast<int>(logits.size()));
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int32_t a, int32_t b) {
      const double va = Value(logits[a]), vb = Value(logits[b]);
      return va > vb || (va == vb && a < b);
    });
    for (int i = 0; i < top; ++i) {
      auto* t = out.add_top();
      t->set_token_id(ids[i]);
      t->set_logprob(logprob(logits[ids[i]]));
    }
  }
  return out;
}

}  // namespace dsv4::worker
