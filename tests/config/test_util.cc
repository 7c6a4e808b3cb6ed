// Test helpers; see test_util.h.
#include "tests/config/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4::testing_config {

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  if (!in) return "";
  std::string bytes(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return bytes;
}

std::string ReadSourceFile(const std::string& relative) {
  const char* root = std::getenv("DSV4_SOURCE_DIR");
  EXPECT_NE(root, nullptr) << "DSV4_SOURCE_DIR is not set (run through ctest)";
  return ReadFileOrDie(std::string(root ? root : ".") + "/" + relative);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const std::filesystem::path base = ::testing::TempDir();
  path_ = (base / ("dsv4_config_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++))).string();
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

uint64_t HashFolder(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](const char* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<unsigned char>(bytes[i]);
      h *= 0x100000001b3ULL;
    }
  };
  std::vector<char> chunk(1 << 20);  // streamed: checkpoints are tens of MB
  for (const std::string& name : names) {
    mix(name.data(), name.size());
    std::ifstream in(dir + "/" + name, std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open " << name;
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      mix(chunk.data(), static_cast<size_t>(in.gcount()));
    }
  }
  return h;
}

nlohmann::json TinyJson() { return nlohmann::json::parse(ReadSourceFile("configs/tiny.json")); }

}  // namespace dsv4::testing_config
