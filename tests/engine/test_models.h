// Helpers for engine tests: a scratch directory under the build tree and tiny models in it.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "engine/make_tiny.h"

namespace kiln::engine::testing {

// A fresh directory under the build tree named after the running test.
inline std::string scratch_dir(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name() + suffix;
  for (auto& ch : name)
    if (ch == '/') ch = '_';
  const auto dir = std::filesystem::path(KILN_BINARY_DIR) / "test-scratch" / "engine" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string make_model(const TinyModelOptions& o, const std::string& suffix = "") {
  const std::string dir = scratch_dir(suffix);
  Status s = make_tiny_model(dir, o);
  EXPECT_TRUE(s.ok()) << s.error();
  return dir;
}

}  // namespace kiln::engine::testing
