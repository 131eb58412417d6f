// The bandwidth probe the benches compare against: it reads the whole buffer it reports, with the
// thread count it was given, and returns a finite positive rate (its speed is measured by
// bench/kernels_bench, never asserted).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/cpu/bandwidth.h"

namespace kiln::engine::cpu {
namespace {

TEST(Bandwidth, ProbeReadsItsBufferWithEachThreadCount) {
  const size_t buffer = size_t{24} << 20;
  for (int threads : {1, 2, 3}) {
    const BandwidthResult r = measure_read_bandwidth(threads, buffer, 2);
    EXPECT_EQ(r.threads, threads);
    // Each thread's slice is rounded down to 256 bytes; nothing else is dropped.
    EXPECT_LE(r.bytes, buffer);
    EXPECT_GT(r.bytes, buffer - size_t(threads) * 256);
    EXPECT_TRUE(std::isfinite(r.gb_per_s));
    EXPECT_GT(r.gb_per_s, 0.01) << threads << " threads";
  }
}

TEST(Bandwidth, ZeroThreadsMeansOne) {
  const BandwidthResult r = measure_read_bandwidth(0, size_t{8} << 20, 1);
  EXPECT_EQ(r.threads, 1);
  EXPECT_GT(r.gb_per_s, 0.0);
}

}  // namespace
}  // namespace kiln::engine::cpu
