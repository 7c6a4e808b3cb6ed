// Lets absl flags be spelled with dashes on the command line (--metrics-listen as well as --metrics_listen),
// the spelling the README, scripts and Kubernetes manifests use. Header-only: dsv4-coordinator and
// dsv4-bench call it before absl::ParseCommandLine.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace dsv4 {

// Rewrites "--a-b-c[=value]" to "--a_b_c[=value]" in place (values and positional arguments untouched);
// `storage` keeps the rewritten strings alive for argv.
inline void UnderscoreFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.reserve(argc);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;  // everything after is positional
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t k = 2; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
    storage.push_back(std::move(a));
    argv[i] = storage.back().data();
  }
}

}  // namespace dsv4
