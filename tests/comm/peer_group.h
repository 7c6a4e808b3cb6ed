// Test helper: a Gloo worker group of comm_peer processes (tests/comm/comm_peer.cc) around a rendezvous store
// hosted by the test, with a scratch directory and a fresh random seed; kills and cleans up on destruction.
#pragma once

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"
#include "tests/comm/subprocess.h"

namespace dsv4::comm::testing {

class GlooGroup {
 public:
  GlooGroup() {
    auto server = TcpStoreServer::Start("127.0.0.1", 0);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
    dir_ = MakeTempDir("comm");
    seed_ = std::random_device{}();
  }
  ~GlooGroup() {
    peers_.clear();  // kills and reaps any rank still running
    std::filesystem::remove_all(dir_);
  }

  // Starts the given ranks of a `world`-rank group with extra comm_peer flags.
  void Start(int world, const std::vector<int>& ranks, const std::vector<std::string>& extra) {
    for (int r : ranks) {
      std::vector<std::string> argv = {DSV4_COMM_PEER,
                                       absl::StrCat("--rank=", r),
                                       absl::StrCat("--world=", world),
                                       absl::StrCat("--store=", server_->Address()),
                                       absl::StrCat("--seed=", seed_),
                                       absl::StrCat("--dir=", dir_)};
      argv.insert(argv.end(), extra.begin(), extra.end());
      peers_.push_back(Subprocess::Start(argv, absl::StrCat(dir_, "/rank", r, ".log")));
      ASSERT_TRUE(peers_.back().started()) << "could not start " << DSV4_COMM_PEER;
    }
  }

  Subprocess& peer(int i) { return peers_[i]; }
  size_t size() const { return peers_.size(); }
  uint64_t seed() const { return seed_; }

  std::string AllOutput() {
    std::string s;
    for (auto& p : peers_) s += p.Output();
    return s;
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::string dir_;
  uint64_t seed_ = 0;
  std::vector<Subprocess> peers_;
};

}  // namespace dsv4::comm::testing
