// Helpers for the security tests: certificates made at test time by scripts/make-dev-certs.sh (the openssl CLI),
// TLS channels from them, and ready files of the real processes.
//
//   <dir>/cluster: ca, worker, coordinator, client  (one CA: what a cluster's certificates look like)
//   <dir>/other:   ca, rogue                        (an unrelated CA: what an attacker's certificate looks like)
// Leaf certificates are for localhost and 127.0.0.1 and carry serverAuth and clientAuth.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/tls_options.h"
#include "grpcpp/channel.h"
#include "tests/worker/process_util.h"

namespace dsv4::testing {

struct TestPki {
  std::string dir;
  std::string Ca(const std::string& realm = "cluster") const { return absl::StrCat(dir, "/", realm, "/ca.crt"); }
  std::string Cert(const std::string& name, const std::string& realm = "cluster") const {
    return absl::StrCat(dir, "/", realm, "/", name, ".crt");
  }
  std::string Key(const std::string& name, const std::string& realm = "cluster") const {
    return absl::StrCat(dir, "/", realm, "/", name, ".key");
  }
};

inline absl::Status MakeTestPki(const std::string& dir) {
  const std::string script = dsv4::worker::testing::SourcePath("scripts/make-dev-certs.sh");
  const std::string cmds[] = {
      absl::StrCat(script, " ca ", dir, "/cluster"),
      absl::StrCat(script, " cert ", dir, "/cluster worker localhost 127.0.0.1"),
      absl::StrCat(script, " cert ", dir, "/cluster coordinator localhost 127.0.0.1"),
      absl::StrCat(script, " cert ", dir, "/cluster client localhost 127.0.0.1"),
      absl::StrCat(script, " ca ", dir, "/other"),
      absl::StrCat(script, " cert ", dir, "/other rogue localhost 127.0.0.1"),
  };
  for (const std::string& c : cmds) {
    if (std::system(c.c_str()) != 0) return absl::InternalError("failed: " + c);
  }
  return absl::OkStatus();
}

// A channel to `target`: TLS verified against `ca` (empty = plaintext), presenting cert/key when given, sending
// `token` as a bearer token when given.
inline std::shared_ptr<grpc::Channel> Channel(const std::string& target, const std::string& ca,
                                              const std::string& cert = "", const std::string& key = "",
                                              const std::string& token = "") {
  ClientTlsOptions o;
  o.ca_file = ca;
  o.cert_file = cert;
  o.key_file = key;
  absl::StatusOr<ChannelSecurity> s = MakeChannelSecurity(o, "", token);
  if (!s.ok()) return nullptr;
  return s->Connect(target);
}

// Waits for a ready file ("key=value key=value\n") while `child` runs; empty map on timeout or exit.
inline std::map<std::string, std::string> WaitReadyFile(dsv4::worker::testing::ChildProcess& child,
                                                        const std::string& path, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    const std::string text = dsv4::worker::testing::ReadFile(path);
    if (!text.empty() && text.back() == '\n') {
      std::map<std::string, std::string> out;
      for (absl::string_view kv : absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), ' ')) {
        std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        out[p.first] = p.second;
      }
      return out;
    }
    siginfo_t info{};  // exited? (WNOWAIT: the caller can still Wait for the exit code)
    if (waitid(P_PID, child.pid(), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == child.pid()) return {};
    absl::SleepFor(absl::Milliseconds(20));
  }
  return {};
}

}  // namespace dsv4::testing
