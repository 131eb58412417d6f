// Memory read bandwidth, measured on the spot: N threads each stream a disjoint part of a buffer
// much larger than the last-level cache, read-only, and the best of a few passes is reported.
// Passes alternate one sequential stream per thread and four prefetched streams per thread.
// The bench programs print achieved GB/s of a kernel against this figure.
#pragma once

#include <cstddef>

namespace kiln::engine::cpu {

struct BandwidthResult {
  double gb_per_s = 0.0;  // 1e9 bytes per second, best pass
  size_t bytes = 0;       // bytes read per pass
  int threads = 0;
};

// buffer_bytes: default 1 GiB (32 MiB L3 on the dev machines); passes: best of this many.
// Starts `threads` std::threads per pass (a probe, not a hot path).
BandwidthResult measure_read_bandwidth(int threads, size_t buffer_bytes = size_t{1} << 30,
                                       int passes = 6);

// The integer multiply rate behind the q8/q4 kernels, on the calling thread: eight independent
// chains of vpmaddwd (16 int16 products each) against the core clock, taken from a chain of
// dependent adds (one per cycle). The prefill panel kernel needs two per 32 weight × activation
// products, so `madd_per_cycle` bounds it. Zeros when the CPU has no AVX2.
struct MultiplyRate {
  double madd_per_ns = 0.0;
  double clock_ghz = 0.0;
  double madd_per_cycle = 0.0;
};
MultiplyRate measure_multiply_rate();

}  // namespace kiln::engine::cpu
