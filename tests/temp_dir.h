// A fresh directory under the system temp dir for one test, removed with everything in it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace vlm::testing {

struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag = "test") {
    std::random_device rd;
    dir = std::filesystem::temp_directory_path() /
          ("vlm_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (dir / name).string(); }
  // Writes `bytes` to dir/name and returns the path.
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }
};

} // namespace vlm::testing
