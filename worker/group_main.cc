// dsv4-group: runs one tensor-parallel group - T dsv4-worker processes, rank r on GPU r - on one machine and
// supervises it as one unit (the process a Kubernetes pod holding T GPUs runs; docs/deploy.md).
//
//   dsv4-group --world=4 [--worker=PATH] [--stop-timeout=180] [--validate-only] -- <dsv4-worker flags>
//
// Worker flags are the leader's, each written --name=value; group_launch.h says what each rank gets. The group
// lives and dies together, because a group that lost a rank cannot serve (docs/tensor-parallel.md):
//   - SIGTERM / SIGINT go to every rank: the leader drains (--drain-timeout) and its shutdown releases the
//     followers; the exit code is the leader's. Ranks still running --stop-timeout seconds later are killed.
//   - any rank that exits on its own (a crash, an OOM kill, a failed start-up) stops the group: the others get
//     SIGTERM, and SIGKILL 5 s later; the exit code is that rank's (1 when it exited 0), so the pod restarts.
//   - if dsv4-group itself is killed, every rank is killed with it (PR_SET_PDEATHSIG).
// --validate-only runs each rank's command line through `dsv4-worker --validate-only` and prints it.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/group_launch.h"

namespace dsv4::worker {
namespace {

constexpr char kUsage[] =
    "usage: dsv4-group --world=T [--worker=PATH] [--stop-timeout=SECONDS] [--validate-only] -- <dsv4-worker flags>\n"
    "Runs ranks 0..T-1 of one tensor-parallel group on this machine (rank r on GPU r) and stops them together.\n"
    "Worker flags are written --name=value; --listen needs a fixed port (docs/deploy.md).\n";

struct GroupFlags {
  int world = 0;
  std::string worker;
  double stop_timeout_s = 180;
  bool validate_only = false;
  std::vector<std::string> worker_flags;
};

int Usage(const std::string& why) {
  std::fprintf(stderr, "dsv4-group: %s\n%s", why.c_str(), kUsage);
  return 2;
}

// dsv4-worker beside this binary.
std::string DefaultWorker() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "dsv4-worker" : (self.parent_path() / "dsv4-worker").string();
}

std::optional<GroupFlags> ParseFlags(int argc, char** argv, int* exit_code) {
  GroupFlags g;
  g.worker = DefaultWorker();
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      *exit_code = 0;
      return std::nullopt;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (name == "--world" && absl::SimpleAtoi(value, &g.world)) continue;
    if (name == "--worker" && !value.empty()) {
      g.worker = value;
      continue;
    }
    if (name == "--stop-timeout" && absl::SimpleAtod(value, &g.stop_timeout_s) && g.stop_timeout_s > 0) continue;
    if (a == "--validate-only") {
      g.validate_only = true;
      continue;
    }
    *exit_code = Usage(absl::StrCat("unknown or malformed argument '", a, "' (worker flags go after --)"));
    return std::nullopt;
  }
  for (; i < argc; ++i) g.worker_flags.emplace_back(argv[i]);
  if (g.world < 1) {
    *exit_code = Usage("--world=T (the group's ranks, one GPU each) is required");
    return std::nullopt;
  }
  return g;
}

std::vector<char*> CArgs(std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (std::string& a : argv) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

// Runs `argv` to completion (stdout and stderr to ours); its exit code, or 128 + signal.
int RunToCompletion(std::vector<std::string> argv) {
  signal(SIGCHLD, SIG_DFL);  // see Supervise
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> c = CArgs(argv);
    execv(c[0], c.data());
    std::fprintf(stderr, "dsv4-group: cannot run %s: %s\n", c[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int ValidateOnly(const GroupFlags& g, const std::vector<std::vector<std::string>>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<std::string> argv = {g.worker};
    argv.insert(argv.end(), ranks[r].begin(), ranks[r].end());
    argv.push_back("--validate-only");
    std::printf("dsv4-group: rank %zu: %s\n", r, absl::StrJoin(argv, " ").c_str());
    std::fflush(stdout);
    if (const int rc = RunToCompletion(argv); rc != 0) {
      std::fprintf(stderr, "dsv4-group: rank %zu's flags were refused (exit %d)\n", r, rc);
      return rc;
    }
  }
  return 0;
}

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;  // exit status, or 128 + signal
};

// Starts rank `r`: the child dies with us (PR_SET_PDEATHSIG) and gets the default signal mask back.
pid_t StartRank(const std::string& worker, std::vector<std::string> args, int r, const sigset_t& original_mask) {
  args.insert(args.begin(), worker);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the supervisor died before prctl took effect
    sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    std::vector<char*> c = CArgs(args);
    execv(c[0], c.data());
    std::fprintf(stderr, "dsv4-group: rank %d: cannot run %s: %s\n", r, c[0], std::strerror(errno));
    _exit(127);
  }
  if (pid > 0) std::fprintf(stderr, "dsv4-group: rank %d pid %d: %s\n", r, pid, absl::StrJoin(args, " ").c_str());
  return pid;
}

std::string Describe(int code) {
  return code >= 128 ? absl::StrCat("was killed by signal ", code - 128) : absl::StrCat("exited with code ", code);
}

int Supervise(const GroupFlags& g, const std::vector<std::vector<std::string>>& args) {
  // An inherited SIG_IGN for SIGCHLD would reap children behind our back (and survives exec): no SIGCHLD, waitpid
  // failing with ECHILD, ranks that never leave "running".
  signal(SIGCHLD, SIG_DFL);
  sigset_t handled, original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGCHLD);
  sigprocmask(SIG_BLOCK, &handled, &original);

  using Clock = std::chrono::steady_clock;
  std::vector<Rank> ranks(args.size());
  std::optional<Clock::time_point> kill_at;  // set once the group is stopping
  int exit_code = 0;
  auto stop = [&](int sig, double after_s) {
    for (Rank& k : ranks) {
      if (k.running) kill(k.pid, sig);
    }
    const auto at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(after_s));
    if (!kill_at || at < *kill_at) kill_at = at;
  };

  // Followers first: they retry the rendezvous until the leader's port answers.
  for (int r = static_cast<int>(args.size()) - 1; r >= 0; --r) {
    ranks[r].pid = StartRank(g.worker, args[r], r, original);
    if (ranks[r].pid < 0) {
      std::fprintf(stderr, "dsv4-group: cannot start rank %d: %s\n", r, std::strerror(errno));
      stop(SIGKILL, 0);
      exit_code = 1;
      break;
    }
    ranks[r].running = true;
  }

  while (true) {
    bool any_running = false;
    for (const Rank& k : ranks) any_running |= k.running;
    if (!any_running) break;
    siginfo_t info{};
    int sig = -1;
    if (kill_at) {
      const auto left = *kill_at - Clock::now();
      if (left <= Clock::duration::zero()) {
        for (size_t r = 0; r < ranks.size(); ++r) {
          if (ranks[r].running) {
            std::fprintf(stderr, "dsv4-group: rank %zu still running at the stop deadline: SIGKILL\n", r);
            kill(ranks[r].pid, SIGKILL);
          }
        }
        kill_at = Clock::now() + std::chrono::seconds(3600);  // only reaping is left
        continue;
      }
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      const timespec ts{.tv_sec = static_cast<time_t>(ns / 1'000'000'000),
                        .tv_nsec = static_cast<long>(ns % 1'000'000'000)};
      sig = sigtimedwait(&handled, &info, &ts);
    } else {
      sig = sigwaitinfo(&handled, &info);
    }
    if (sig < 0) continue;  // timeout or EINTR: the loop checks the deadline
    if (sig == SIGTERM || sig == SIGINT) {
      if (!kill_at) {
        std::fprintf(stderr, "dsv4-group: signal %d: stopping the group (leader drains, then the followers leave)\n",
                     sig);
        stop(SIGTERM, g.stop_timeout_s);
      }
      continue;
    }
    // SIGCHLD: reap every child that has exited - ranks, and orphans handed to us as a container's PID 1 (a
    // timed-out probe's process, say), which would otherwise stay zombies.
    while (true) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      size_t r = 0;
      while (r < ranks.size() && !(ranks[r].running && ranks[r].pid == pid)) ++r;
      if (r == ranks.size()) continue;  // not a rank
      Rank& k = ranks[r];
      k.running = false;
      k.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (kill_at) {
        std::fprintf(stderr, "dsv4-group: rank %zu %s\n", r, Describe(k.exit_code).c_str());
        if (r == 0 && exit_code == 0) exit_code = k.exit_code;
        continue;
      }
      std::fprintf(stderr, "dsv4-group: rank %zu %s on its own: stopping the group\n", r,
                   Describe(k.exit_code).c_str());
      exit_code = k.exit_code != 0 ? k.exit_code : 1;
      stop(SIGTERM, 5);
    }
  }
  std::fprintf(stderr, "dsv4-group: every rank has exited; exit code %d\n", exit_code);
  return exit_code;
}

}  // namespace
}  // namespace dsv4::worker

int main(int argc, char** argv) {
  int exit_code = 0;
  const auto flags = dsv4::worker::ParseFlags(argc, argv, &exit_code);
  if (!flags) return exit_code;
  const auto ranks = dsv4::worker::GroupRankArgs(flags->world, flags->worker_flags);
  if (!ranks.ok()) return dsv4::worker::Usage(std::string(ranks.status().message()));
  if (flags->validate_only) return dsv4::worker::ValidateOnly(*flags, *ranks);
  return dsv4::worker::Supervise(*flags, *ranks);
}
