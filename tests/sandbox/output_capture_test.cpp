// OutputCapture keeps head and tail exactly and counts what fell between.
#include "sandbox/output_capture.h"

#include <gtest/gtest.h>

#include <random>

namespace kiln::sandbox {
namespace {

TEST(OutputCapture, KeepsEverythingUnderTheCap) {
  OutputCapture c(8, 8);
  c.append("hello ");
  c.append("world");
  EXPECT_EQ(c.head() + c.tail(), "hello world");
  EXPECT_EQ(c.dropped_bytes(), 0u);
  EXPECT_EQ(c.total_bytes(), 11u);
}

TEST(OutputCapture, KeepsHeadAndTailOfAnyChunkingAgainstAPlainModel) {
  std::mt19937 rng(42);
  std::string all;
  for (int i = 0; i < 5000; ++i) all += static_cast<char>('a' + rng() % 26);
  for (int trial = 0; trial < 50; ++trial) {
    std::size_t head = rng() % 300, tail = rng() % 300;
    OutputCapture c(head, tail);
    for (std::size_t pos = 0; pos < all.size();) {
      std::size_t n = std::min<std::size_t>(all.size() - pos, rng() % 700);
      c.append(std::string_view(all).substr(pos, n));
      pos += n;
    }
    ASSERT_EQ(c.head(), all.substr(0, head));
    ASSERT_EQ(c.tail(), all.substr(all.size() - tail));
    ASSERT_EQ(c.dropped_bytes(), all.size() - head - tail);
  }
}

TEST(OutputCapture, MarkerNamesTheDroppedBytes) {
  EXPECT_EQ(join_with_marker("ab", "yz", 0), "abyz");
  EXPECT_EQ(join_with_marker("ab\n", "yz", 10), "ab\n[... 10 bytes of output dropped ...]\nyz");
}

}  // namespace
}  // namespace kiln::sandbox
