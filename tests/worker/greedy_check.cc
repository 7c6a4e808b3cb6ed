// See greedy_check.h.
#include "tests/worker/greedy_check.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/worker/process_util.h"
#include "tools/generate/npy.h"

namespace dsv4::worker::testing {

absl::Status SameGreedyTokens(const std::string& checkpoint, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                              const std::vector<std::string>& generate_flags, const std::string& scratch_dir,
                              double tie) {
  const std::string streams = absl::StrCat("got [", absl::StrJoin(got, ","), "] want [", absl::StrJoin(want, ","),
                                           "]");
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return absl::OkStatus();
  if (i == got.size() || i == want.size()) {
    return absl::InternalError(absl::StrCat("the streams have different lengths: ", streams));
  }
  // The reference's logits at the first difference: the same prompt and common prefix, one more token.
  std::vector<int32_t> prefix = prompt;
  prefix.insert(prefix.end(), want.begin(), want.begin() + static_cast<int64_t>(i));
  static int calls = 0;
  const std::string npy = absl::StrCat(scratch_dir, "/tie_", getpid(), "_", calls++, ".npy");
  std::vector<std::string> argv = {BinaryPath("tools/generate/dsv4-generate"), "--checkpoint", checkpoint,
                                   "--prompt-ids", absl::StrJoin(prefix, ","), "--max-new-tokens", "1",
                                   "--dump-logits", npy};
  argv.insert(argv.end(), generate_flags.begin(), generate_flags.end());
  if (absl::StatusOr<std::string> out = RunAndCapture(argv, 300); !out.ok()) return out.status();
  absl::StatusOr<npy::Array> logits = npy::Read(npy);
  if (!logits.ok()) return logits.status();
  if (logits->shape.size() != 2 || logits->shape[0] < static_cast<int64_t>(prefix.size())) {
    return absl::InternalError(absl::StrCat(npy, ": unexpected logits shape"));
  }
  const int64_t V = logits->shape[1];
  const float* row = logits->as<float>() + (static_cast<int64_t>(prefix.size()) - 1) * V;
  double max_abs = 0;
  for (int64_t v = 0; v < V; ++v) max_abs = std::max<double>(max_abs, std::fabs(row[v]));
  const int32_t a = got[i], b = want[i];
  if (a < 0 || a >= V || b < 0 || b >= V) return absl::InternalError(absl::StrCat("token out of range: ", streams));
  const double gap = std::fabs(static_cast<double>(row[a]) - row[b]) / std::max(max_abs, 1e-30);
  const std::string where = absl::StrCat("token ", i, ": got ", a, " (logit ", row[a], ") want ", b, " (logit ",
                                         row[b], "), gap ", gap, " of max |logit| ", max_abs);
  if (gap > tie) {
    return absl::InternalError(absl::StrCat("the streams differ at ", where, " - not a near tie (<= ", tie, "): ",
                                            streams));
  }
  std::printf("streams part at a near tie, %s: accepted\n", where.c_str());
  return absl::OkStatus();
}

}  // namespace dsv4::worker::testing
