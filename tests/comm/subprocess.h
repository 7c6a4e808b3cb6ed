// Test helper: start a child process with stdout+stderr captured to a file, poll it, kill it, wait for it with a
// deadline. Used by the multi-process communicator and rendezvous tests (real processes on loopback).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dsv4::comm::testing {

class Subprocess {
 public:
  // Starts argv[0] with the given arguments; output goes to log_path.
  static Subprocess Start(const std::vector<std::string>& argv, const std::string& log_path) {
    Subprocess p;
    p.log_path_ = log_path;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&p.pid_, args[0], &fa, nullptr, args.data(), environ) != 0) p.pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    return p;
  }

  Subprocess() = default;
  Subprocess(Subprocess&& o) noexcept { *this = std::move(o); }
  Subprocess& operator=(Subprocess&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(log_path_, o.log_path_);
    std::swap(exit_, o.exit_);
    return *this;
  }
  // Never leaves a child behind, whatever the test did.
  ~Subprocess() {
    if (pid_ > 0 && !exit_) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  void Signal(int sig) { kill(pid_, sig); }

  // Exit status (exit code, or 128 + signal) once the process ended, polling until `timeout`; nullopt if it is
  // still running then.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exit_) {
      int st = 0;
      const pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        exit_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return exit_;
  }

  std::string Output() const {
    std::ifstream f(log_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // Polls the output until it contains `text` or the deadline passes.
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<int> exit_;
};

// A fresh directory under TEST_TMPDIR or /tmp, removed by the caller's choice (left for post-mortem otherwise).
inline std::string MakeTempDir(const std::string& tag) {
  const char* base = getenv("TEST_TMPDIR");
  std::string templ = std::string(base != nullptr ? base : "/tmp") + "/dsv4-" + tag + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  const char* dir = mkdtemp(buf.data());
  return dir != nullptr ? std::string(dir) : std::string();
}

}  // namespace dsv4::comm::testing
