#include "engine/cpu/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "engine/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::engine::cpu {

namespace {

// Read-only streaming sum; the result is kept so the loads cannot be removed.
uint64_t read_sum_scalar(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a ^= p[i];
    b ^= p[i + 1];
    c ^= p[i + 2];
    d ^= p[i + 3];
  }
  return a ^ b ^ c ^ d;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint64_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  const auto* v = reinterpret_cast<const __m256i*>(p);
  const size_t nv = n / 4;
  for (size_t i = 0; i + 4 <= nv; i += 4) {
    a = _mm256_xor_si256(a, _mm256_load_si256(v + i));
    b = _mm256_xor_si256(b, _mm256_load_si256(v + i + 1));
    c = _mm256_xor_si256(c, _mm256_load_si256(v + i + 2));
    d = _mm256_xor_si256(d, _mm256_load_si256(v + i + 3));
  }
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), x);
  return out[0] ^ out[1] ^ out[2] ^ out[3];
}

// Four streams a quarter of the slice apart, read in lockstep with software prefetch 2 KiB ahead
// of each: more misses in flight than one stream and the hardware prefetcher keep (the decode
// kernels read this way: several rows at a time, prefetching ahead).
__attribute__((target("avx2"))) uint64_t read_sum_avx2_streams(const uint64_t* p, size_t n) {
  const size_t nv = n / 4 / 4 / 2 * 2;  // 32-byte vectors per stream, even
  const auto* s0 = reinterpret_cast<const __m256i*>(p);
  const __m256i *s1 = s0 + nv, *s2 = s1 + nv, *s3 = s2 + nv;
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  constexpr size_t kAhead = 64;  // vectors (2 KiB)
  for (size_t i = 0; i < nv; i += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(s0 + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s1 + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s2 + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s3 + i + kAhead), _MM_HINT_T0);
    a = _mm256_xor_si256(a, _mm256_xor_si256(_mm256_load_si256(s0 + i), _mm256_load_si256(s0 + i + 1)));
    b = _mm256_xor_si256(b, _mm256_xor_si256(_mm256_load_si256(s1 + i), _mm256_load_si256(s1 + i + 1)));
    c = _mm256_xor_si256(c, _mm256_xor_si256(_mm256_load_si256(s2 + i), _mm256_load_si256(s2 + i + 1)));
    d = _mm256_xor_si256(d, _mm256_xor_si256(_mm256_load_si256(s3 + i), _mm256_load_si256(s3 + i + 1)));
  }
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), x);
  return out[0] ^ out[1] ^ out[2] ^ out[3];
}
#endif

// Pass `pass` alternates the two read patterns (odd: four prefetched streams); the probe keeps
// the best pass of either, so it reports what the machine can deliver, not what one loop gets.
uint64_t read_sum(const uint64_t* p, size_t n, int pass) {
#if defined(__x86_64__)
  if (cpu_features().avx2) return pass % 2 ? read_sum_avx2_streams(p, n) : read_sum_avx2(p, n);
#endif
  (void)pass;
  return read_sum_scalar(p, n);
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

BandwidthResult measure_read_bandwidth(int threads, size_t buffer_bytes, int passes) {
  threads = std::max(threads, 1);
  const size_t per_thread = (buffer_bytes / threads) & ~size_t{255};
  const size_t total = per_thread * threads;
  std::unique_ptr<void, FreeDeleter> buf(std::aligned_alloc(64, total));
  // First touch from the threads that will read (pages land near them on NUMA machines).
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] { std::memset(static_cast<char*>(buf.get()) + t * per_thread, t + 1, per_thread); });
    for (auto& th : ts) th.join();
  }
  std::atomic<uint64_t> sink{0};
  double best_s = 1e30;
  for (int pass = 0; pass < passes; ++pass) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const auto* p = reinterpret_cast<const uint64_t*>(static_cast<char*>(buf.get()) + t * per_thread);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        sink.fetch_xor(read_sum(p, per_thread / 8, pass));
      });
    while (ready.load() < threads) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : ts) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_s = std::min(best_s, s);
  }
  return BandwidthResult{static_cast<double>(total) / best_s / 1e9, total, threads};
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) double madd_per_ns(int64_t iterations) {
  // Eight chains: enough to cover a 3-4 cycle latency on two ports, few enough to stay in
  // registers (twelve spilled to the stack and measured the spills instead).
  constexpr int kChains = 8;
  __m256i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi16(int16_t(i + 1));
  const __m256i x = _mm256_set1_epi16(3);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 8
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_madd_epi16(acc[i], x);
  }
  const double s = seconds_since(t0);
  int sink = 0;
  for (const __m256i& a : acc) sink += _mm256_extract_epi32(a, 0);
  asm volatile("" : : "r"(sink));
  return double(iterations) * kChains / s / 1e9;
}

double clock_ghz(int64_t iterations) {
  int64_t x = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iterations; ++n)
    asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));  // 4 dependent cycles
  return double(iterations) * 4 / seconds_since(t0) / 1e9;
}
#endif

}  // namespace

MultiplyRate measure_multiply_rate() {
  MultiplyRate r;
#if defined(__x86_64__)
  if (!cpu_features().avx2) return r;
  for (int pass = 0; pass < 3; ++pass) {  // best of three: a busy machine only lowers them
    r.madd_per_ns = std::max(r.madd_per_ns, madd_per_ns(30'000'000));
    r.clock_ghz = std::max(r.clock_ghz, clock_ghz(100'000'000));
  }
  r.madd_per_cycle = r.madd_per_ns / r.clock_ghz;
#endif
  return r;
}

}  // namespace kiln::engine::cpu
