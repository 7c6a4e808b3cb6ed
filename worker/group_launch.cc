#include "worker/group_launch.h"

#include <algorithm>
#include <iterator>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "worker/options.h"

namespace dsv4::worker {
namespace {

struct Flag {
  std::string name;  // '-' spelling ("max-batch" for --max_batch too: the worker takes both)
  std::string text;  // as written
  std::string value;
};

bool Contains(std::span<const char* const> names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

absl::StatusOr<std::vector<std::vector<std::string>>> GroupRankArgs(int world,
                                                                    const std::vector<std::string>& worker_flags) {
  if (world < 1 || world > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--world ", world, " must lie in [1, 64] (ranks on this machine)"));
  }
  std::vector<Flag> flags;
  std::string listen;
  for (const std::string& a : worker_flags) {
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("worker argument '", a,
                                                     "' is not a flag: write every worker flag as --name=value"));
    }
    const size_t eq = a.find('=');
    Flag f{.name = absl::StrReplaceAll(a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2), {{"_", "-"}}),
           .text = a,
           .value = eq == std::string::npos ? "" : a.substr(eq + 1)};
    if (Contains(kGroupOwnedFlags, f.name)) {
      return absl::InvalidArgumentError(absl::StrCat("--", f.name,
                                                     " is set by dsv4-group for each rank (rank r: --rank=r --device=r "
                                                     "--world, --host=127.0.0.1, --leader); remove it"));
    }
    if (f.name == "listen") listen = f.value;
    flags.push_back(std::move(f));
  }
  if (listen.empty()) {
    return absl::InvalidArgumentError("--listen=HOST:PORT is required: the followers dial the leader's port");
  }
  std::string host;
  int port = 0;
  DSV4_RETURN_IF_ERROR(ParseHostPort("--listen", listen, &host, &port));
  if (port == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--listen '", listen,
                                                   "' needs a fixed port in a group: the followers dial it"));
  }
  // The leader listens on every interface or on loopback: the followers, on the same machine, dial loopback.
  const bool any = host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "localhost";
  const std::string leader = absl::StrCat(any ? "127.0.0.1" : host, ":", port);

  std::vector<std::vector<std::string>> ranks(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string>& args = ranks[r];
    for (const Flag& f : flags) {
      if (r > 0 && Contains(kLeaderOnlyFlags, f.name)) continue;
      args.push_back(f.text);
    }
    args.push_back(absl::StrCat("--rank=", r));
    args.push_back(absl::StrCat("--world=", world));
    args.push_back(absl::StrCat("--device=", r));
    args.push_back("--host=127.0.0.1");
    if (r > 0) {
      args.push_back("--leader=" + leader);
      args.push_back("--listen=127.0.0.1:0");
    }
  }
  return ranks;
}

}  // namespace dsv4::worker
