// A test suite whose tests start real dsv4-worker processes on tiny checkpoints made once for the whole suite, in
// a folder that is kept when a test failed (the processes' logs are there). Skips without dsv4_model.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/process_util.h"

namespace dsv4::worker::testing {

class TinyCheckpointSuite : public ::testing::Test {
 protected:
  // From SetUpTestSuite: <TempDir>/<name>_<pid>/tiny<seed> for each seed.
  static void MakeCheckpoints(const std::string& name, std::initializer_list<int> seeds) {
#if !defined(DSV4_WORKER_HAVE_MODEL)
    return;
#endif
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/", name, "_", getpid()));
    std::filesystem::create_directories(*dir_);
    for (int seed : seeds) {
      const absl::Status made = MakeTinyCheckpoint(Checkpoint(seed), seed);
      ASSERT_TRUE(made.ok()) << made;
    }
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr && ::testing::UnitTest::GetInstance()->failed_test_count() == 0) {
      std::filesystem::remove_all(*dir_);
    }
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
#if !defined(DSV4_WORKER_HAVE_MODEL)
    GTEST_SKIP() << "dsv4_model is not part of this build: no dsv4-worker to test";
#endif
    ASSERT_NE(dir_, nullptr);
  }

  static std::string Checkpoint(int seed) { return absl::StrCat(*dir_, "/tiny", seed); }

  static inline std::string* dir_ = nullptr;
};

}  // namespace dsv4::worker::testing
