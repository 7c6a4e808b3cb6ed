#include "worker/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace dsv4::worker {

dsv4::v1::TokenLogprob TokenLogprobOf(std::span<const float> logits, int32_t token, int top) {
  double max = -std::numeric_limits<double>::infinity();
  for (float v : logits) max = std::max(max, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double log_z = max + std::log(sum);
  dsv4::v1::TokenLogprob out;
  out.set_logprob(static_cast<float>(static_cast<double>(logits[token]) - log_z));
  top = std::min<int>(top, static_cast<int>(logits.size()));
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < top; ++i) {
      auto* t = out.add_top();
      t->set_token_id(ids[i]);
      t->set_logprob(static_cast<float>(static_cast<double>(logits[ids[i]]) - log_z));
    }
  }
  return out;
}

}  // namespace dsv4::worker
