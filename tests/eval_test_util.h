// Helpers shared by the evaluation tests: where the golden cases are, and scratch directories.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <unistd.h>

namespace bev::eval::testing {

inline std::string golden_dir() { return std::string(BEV_SHARED_DIR) + "/golden/nuseval"; }

// A fresh directory under the build tree, named after the running test.
inline std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  const std::filesystem::path p =
      std::filesystem::path(BEV_BINARY_DIR) / "test_eval_tmp" / (name + "." + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace bev::eval::testing
