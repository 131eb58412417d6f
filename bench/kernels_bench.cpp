// kernels_bench: how close do the CPU matmul kernels run to the memory bandwidth (decode) and to
// the arithmetic peak (prefill)? Prints one table row per kernel table × weight format × shape,
// with the read bandwidth measured on the spot with the same thread count.
//
//   build/bin/kernels_bench [--threads N] [--mib M] [--reps R] [--tokens T] [--table ref|avx2|best]
//
// Decode rows: y = W x for one token over a weight matrix of ~M MiB (larger than the caches),
// achieved GB/s = stored weight bytes / time. Prefill rows: T tokens through a 4096×1024 matrix,
// GFLOP/s = 2·N·K·T / time. Every kernel is checked against the reference before it is timed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu/bandwidth.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"

using namespace kiln::engine::cpu;

namespace {

// Persistent workers released by a generation counter: the shape a real pool has, so the
// numbers include one fork/join per product as the engine pays.
class SpinPool {
 public:
  explicit SpinPool(int n) : n_(n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~SpinPool() {
    stop_ = true;
    gen_.fetch_add(1);
    for (auto& t : workers_) t.join();
  }
  void run(const std::function<void(int, int)>& fn) {  // fn(thread, threads)
    fn_ = &fn;
    done_.store(0);
    gen_.fetch_add(1, std::memory_order_release);
    fn(0, n_);
    while (done_.load(std::memory_order_acquire) < n_ - 1) {
    }
  }

 private:
  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g;
      int spins = 0;
      while ((g = gen_.load(std::memory_order_acquire)) == seen)
        if (++spins > 4096) std::this_thread::yield();
      seen = g;
      if (stop_) return;
      (*fn_)(i, n_);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  int n_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int, int)>* fn_ = nullptr;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const KernelTable* pick_table(const std::string& name) {
  if (name == "ref") return &kernels_ref();
  if (name == "avx2") return kernels_avx2();
  if (name == "avx512") return kernels_avx512();
  return &kernels_best();
}

struct Options {
  int threads = 2;
  int mib = 256;
  int reps = 10;
  int tokens = 128;
  std::string table = "best";
};

double time_product(SpinPool& pool, const KernelTable& kt, const WeightMatrix& w,
                    const MatmulInput& in, float* y, int reps) {
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = now_s();
    pool.run([&](int i, int n) {
      // Rows split in multiples of 4 so every thread runs full decode tiles.
      const int64_t per = ((w.rows + n - 1) / n + 3) / 4 * 4;
      const int64_t r0 = std::min<int64_t>(w.rows, i * per), r1 = std::min<int64_t>(w.rows, r0 + per);
      if (r0 < r1) kt.matmul[int(w.format)](w, in, y, w.rows, r0, r1);
    });
    times.push_back(now_s() - t0);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];  // median
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string cmdline;
  for (int i = 0; i < argc; ++i) cmdline += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") o.threads = std::atoi(v.c_str());
    else if (a == "--mib") o.mib = std::atoi(v.c_str());
    else if (a == "--reps") o.reps = std::atoi(v.c_str());
    else if (a == "--tokens") o.tokens = std::atoi(v.c_str());
    else if (a == "--table") o.table = v;
    else {
      std::fprintf(stderr, "kernels_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const KernelTable* kt = pick_table(o.table);
  if (!kt) {
    std::fprintf(stderr, "kernels_bench: table %s is not supported by this CPU\n", o.table.c_str());
    return 2;
  }
  const BandwidthResult bw = measure_read_bandwidth(o.threads);
  std::printf("# %s\n# cpu: %s; kernels: %s; threads: %d\n", cmdline.c_str(),
              cpu_features_string().c_str(), kt->name, o.threads);
  std::printf("# measured read bandwidth: %.1f GB/s (%d threads, %.0f MiB buffer)\n\n", bw.gb_per_s,
              bw.threads, bw.bytes / 1048576.0);
  std::printf("| kernel | format | shape (N×K×T) | bytes | median ms | GB/s | %% of bw | GFLOP/s |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|\n");

  SpinPool pool(o.threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.03f);
  const int64_t cols = 1024;
  std::vector<float> x(static_cast<size_t>(std::max(o.tokens, 1)) * cols);
  for (auto& v : x) v = dist(rng) * 30;

  for (int fi = 0; fi < kWeightFormatCount; ++fi) {
    const auto f = static_cast<WeightFormat>(fi);
    // Decode: one matrix of ~mib MiB in this format, rows a multiple of 64.
    const int64_t rows = std::max<int64_t>(64, (int64_t(o.mib) << 20) / int64_t(row_bytes(f, cols)) / 64 * 64);
    std::vector<uint8_t> wbytes(rows * row_bytes(f, cols));
    {
      std::vector<float> wrow(cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (auto& v : wrow) v = dist(rng);
        kt->quantize[fi](wrow.data(), wbytes.data() + r * row_bytes(f, cols), cols);
      }
    }
    for (int64_t n : {int64_t{1}, int64_t{o.tokens}}) {
      // Prefill timing uses the first 4096 rows: the question there is arithmetic, not memory.
      const WeightMatrix wt{f, n == 1 ? rows : std::min<int64_t>(rows, 4096), cols, wbytes.data()};
      ActQ16Buffer buf, buf_ref;
      std::vector<float> y(n * wt.rows), y_ref(n * 64);
      const MatmulInput in = prepare_input(*kt, f, x.data(), n, cols, buf);
      // Validate before timing: the first 64 rows against the reference kernel.
      const WeightMatrix w64{f, 64, cols, wbytes.data()};
      matmul(kernels_ref(), w64, x.data(), n, y_ref.data(), 64, buf_ref);
      kt->matmul[fi](w64, in, y.data(), 64, 0, 64);
      for (int64_t i = 0; i < n * 64; ++i)
        if (std::fabs(y[i] - y_ref[i]) > 1e-3 * (1 + std::fabs(y_ref[i]))) {
          std::fprintf(stderr, "kernels_bench: %s %s disagrees with the reference at %lld\n", kt->name,
                       weight_format_name(f), static_cast<long long>(i));
          return 1;
        }
      const double s = time_product(pool, *kt, wt, in, y.data(), n == 1 ? o.reps : std::max(3, o.reps / 3));
      const double bytes = double(wt.rows) * row_bytes(f, cols);
      const double gbs = bytes / s / 1e9;
      const double gflops = 2.0 * wt.rows * cols * n / s / 1e9;
      std::printf("| %s | %s | %lld×%lld×%lld | %.0f MB | %.3f | %.1f | %.0f%% | %.1f |\n", kt->name,
                  weight_format_name(f), static_cast<long long>(wt.rows), static_cast<long long>(cols),
                  static_cast<long long>(n), bytes / 1e6, s * 1e3, gbs, 100 * gbs / bw.gb_per_s, gflops);
      std::fflush(stdout);
    }
  }
  return 0;
}
