// Helpers for the config/inventory/generator tests: repository files, temp folders, JSON edits.
#pragma once

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace dsv4::testing_config {

// Text of a file under the source tree (DSV4_SOURCE_DIR, set by ctest); fails the test when missing.
std::string ReadSourceFile(const std::string& relative);
std::string ReadFileOrDie(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);

// A fresh folder under the test temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// FNV-1a 64 over every regular file of `dir` (names sorted, each name and its bytes hashed).
uint64_t HashFolder(const std::string& dir);

// configs/tiny.json parsed, for tests that edit one field.
nlohmann::json TinyJson();

}  // namespace dsv4::testing_config
