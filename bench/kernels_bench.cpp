// kernels_bench: how close do the CPU matmul kernels run to the memory bandwidth (decode) and to
// the arithmetic peak (prefill)? Prints one table row per kernel table × weight format × shape,
// with the read bandwidth measured on the spot with the same thread count, and the fork/join
// cost of the engine's thread pool.
//
//   build/bin/kernels_bench [--threads N] [--reps R] [--tokens T] [--decode-tokens T] [--table ref|avx2|best]
//                           [--formats q8,q4,bf16,f32] [--pool-mib M]
//                           [--attn-tokens T] [--attn-context N]
//
// Decode rows (T = 1, or --decode-tokens): issue 9's bench shapes — 1024×1024 (attention/GDN projections), 512×1024
// (expert gate/up), 1024×512 (expert down), 32768×1024 (lm_head) — plus one big matrix. A decode
// step streams ~0.4 GB of weights, so no matrix is warm in the caches when its product runs: every
// repetition uses the next of enough copies to fill --pool-mib (default 512 MiB ≫ L3). The row split
// is the engine's (ThreadPool::parallel_for over 4-row tiles), so each row includes one fork/join.
// GB/s = stored weight bytes / time, from the best and the median repetition.
// Prefill rows: T tokens through 512×1024 and 4096×1024; GFLOP/s = 2·N·K·T / time.
// Every kernel of those rows is checked against the reference before it is timed.
// Then one MoE layer's experts as a decode step runs them (ops::matmul_swiglu_group for every
// expert's gate and up, ops::matmul_group for the downs, always the best kernels, which the
// engine's tests check): n sessions route n × 8 rows to E distinct experts of the bench shape
// — 8 × 1 for one session; 26, 41 and 55 experts for 4, 8 and 16, as the engine bench counts
// them. Repetitions walk a shuffled pool of experts (at least --pool-mib) without reuse. Last, prefill attention: the last T tokens of an N-token prompt (default 512 of
// 4,096) on the bench shape's heads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cpu/bandwidth.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/thread_pool.h"
#include "engine/ops.h"
#include "engine/weights/safetensors.h"

using namespace kiln::engine::cpu;
using kiln::engine::ThreadPool;

namespace {

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
  int reps = 20;
  int tokens = 64;
  int decode_tokens = 1;  // tokens through the decode rows (the streaming kernels take up to 4 at once)
  int pool_mib = 512;
  int attn_tokens = 512, attn_context = 4096;
  std::string table = "best";
  std::vector<WeightFormat> formats = {WeightFormat::q8, WeightFormat::q4, WeightFormat::bf16, WeightFormat::f32};
};

struct Timing {
  double best = 0, median = 0;
};

Timing summarize(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return Timing{t.front(), t[t.size() / 2]};
}

// One product split like ops::matmul splits it: 4-row tiles through the pool.
void product(ThreadPool& pool, const KernelTable& kt, const WeightMatrix& w, const MatmulInput& in, float* y) {
  const MatmulFn fn = kt.matmul[int(w.format)];
  const int64_t tiles = (w.rows + 3) / 4;
  pool.parallel_for(tiles, 1, [&](int64_t b, int64_t e) { fn(w, in, y, w.rows, b * 4, std::min(w.rows, e * 4)); });
}

struct Shape {
  const char* what;
  int64_t rows, cols;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string cmdline;
  for (int i = 0; i < argc; ++i) {
    if (i) cmdline += ' ';
    cmdline += argv[i];  // appended in place: `" " + std::string(…)` tripped GCC 12's -Wrestrict
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") o.threads = std::atoi(v.c_str());
    else if (a == "--reps") o.reps = std::max(1, std::atoi(v.c_str()));
    else if (a == "--tokens") o.tokens = std::max(2, std::atoi(v.c_str()));
    else if (a == "--decode-tokens") o.decode_tokens = std::clamp(std::atoi(v.c_str()), 1, 64);
    else if (a == "--pool-mib") o.pool_mib = std::max(1, std::atoi(v.c_str()));
    else if (a == "--attn-tokens") o.attn_tokens = std::max(1, std::atoi(v.c_str()));
    else if (a == "--attn-context") o.attn_context = std::max(1, std::atoi(v.c_str()));
    else if (a == "--table") o.table = v;
    else if (a == "--formats") {
      o.formats.clear();
      std::stringstream ss(v);
      std::string name;
      while (std::getline(ss, name, ',')) {
        const auto f = parse_weight_format(name);
        if (!f) {
          std::fprintf(stderr, "kernels_bench: --formats: unknown format %s (f32, bf16, q8, q4)\n", name.c_str());
          return 2;
        }
        o.formats.push_back(*f);
      }
    } else {
      std::fprintf(stderr, "kernels_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const KernelTable* kt = pick_table(o.table);
  if (!kt) {
    std::fprintf(stderr, "kernels_bench: table %s is not supported by this CPU\n", o.table.c_str());
    return 2;
  }
  ThreadPool pool(o.threads);
  const BandwidthResult bw = measure_read_bandwidth(o.threads);
  std::printf("# %s\n# cpu: %s; kernels: %s; threads: %d\n", cmdline.c_str(), cpu_features_string().c_str(),
              kt->name, pool.size());
  std::printf("# measured read bandwidth: %.1f GB/s (%d threads, %.0f MiB buffer)\n", bw.gb_per_s, bw.threads,
              bw.bytes / 1048576.0);
  const MultiplyRate mr = measure_multiply_rate();
  std::printf("# integer multiply (one thread): %.2f vpmaddwd/ns at ~%.2f GHz = %.2f per cycle; the q8/q4 panel "
              "kernel needs 2 per 32 products, so one core peaks at %.0f G products/s\n",
              mr.madd_per_ns, mr.clock_ghz, mr.madd_per_cycle, mr.madd_per_ns * 16);
  {
    // Fork/join: a section of one 5 µs chunk per thread, as many times as a decode step has
    // sections; the cost is the time beyond 5 µs (an empty section would let the caller run every
    // chunk before a worker even looks).
    auto busy = [](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const double until = now_s() + 5e-6;
        while (now_s() < until) {
        }
      }
    };
    // Warm up for 0.2 s: the workers went to sleep during the bandwidth probe, and waking a
    // sleeping thread waits for the scheduler (the caller runs every chunk meanwhile).
    for (const double until = now_s() + 0.2; now_s() < until;) pool.parallel_for(pool.size(), 1, busy);
    std::vector<double> t;
    for (int rep = 0; rep < 2000; ++rep) {
      const double t0 = now_s();
      pool.parallel_for(pool.size(), 1, busy);
      t.push_back(now_s() - t0 - 5e-6);
    }
    const Timing fj = summarize(t);
    std::printf("# thread pool fork/join (%d threads, one 5 µs chunk each, time beyond 5 µs): best %.2f µs, median %.2f µs\n\n",
                pool.size(), fj.best * 1e6, fj.median * 1e6);
  }
  std::printf("| kernel | format | shape (N×K×T) | what | bytes | best ms | median ms | GB/s best | GB/s median | "
              "%% of bw | GFLOP/s |\n");
  std::printf("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");

  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.03f);
  const int64_t kMaxCols = 1024;
  std::vector<float> x(static_cast<size_t>(std::max(o.tokens, o.decode_tokens)) * kMaxCols);
  for (auto& v : x) v = dist(rng) * 30;
  const Shape decode_shapes[] = {{"attn/GDN proj", 1024, 1024}, {"expert gate/up", 512, 1024},
                                 {"expert down", 1024, 512},    {"lm_head", 32768, 1024},
                                 {"streaming", 65536, 1024}};
  const Shape prefill_shapes[] = {{"expert gate/up", 512, 1024}, {"large", 4096, 1024}};

  for (const WeightFormat f : o.formats) {
    const int fi = int(f);
    auto emit = [&](const Shape& s, int64_t n, const Timing& t) {
      const double bytes = double(s.rows) * row_bytes(f, s.cols);
      const double flops = 2.0 * s.rows * s.cols * n;
      std::printf("| %s | %s | %lld×%lld×%lld | %s | %.2f MB | %.3f | %.3f | %.1f | %.1f | %.0f%% | %.1f |\n", kt->name,
                  weight_format_name(f), static_cast<long long>(s.rows), static_cast<long long>(s.cols),
                  static_cast<long long>(n), s.what, bytes / 1e6, t.best * 1e3, t.median * 1e3, bytes / t.best / 1e9,
                  bytes / t.median / 1e9, 100 * bytes / t.best / 1e9 / bw.gb_per_s, flops / t.best / 1e9);
      std::fflush(stdout);
    };
    for (int pass = 0; pass < 2; ++pass) {
      const bool decode = pass == 0;
      for (const Shape& s : decode ? std::vector<Shape>(std::begin(decode_shapes), std::end(decode_shapes))
                                   : std::vector<Shape>(std::begin(prefill_shapes), std::end(prefill_shapes))) {
        const int64_t n = decode ? o.decode_tokens : o.tokens;
        const size_t mbytes = size_t(s.rows) * row_bytes(f, s.cols);
        // Decode: enough copies that the caches never hold the next one; prefill: one copy.
        const size_t copies = decode ? std::max<size_t>(2, (size_t(o.pool_mib) << 20) / mbytes) : 1;
        std::vector<uint8_t> wbytes(copies * mbytes);
        {
          std::vector<float> wrow(static_cast<size_t>(s.cols));
          for (int64_t r = 0; r < s.rows; ++r) {
            for (auto& v : wrow) v = dist(rng);
            kt->quantize[fi](wrow.data(), wbytes.data() + r * row_bytes(f, s.cols), s.cols);
          }
          for (size_t c = 1; c < copies; ++c) std::memcpy(wbytes.data() + c * mbytes, wbytes.data(), mbytes);
        }
        ActQ16Buffer buf, buf_ref;
        const MatmulInput in = prepare_input(*kt, f, x.data(), n, s.cols, buf);
        std::vector<float> y(size_t(n * s.rows)), y_ref(size_t(n * s.rows));
        // Validate before timing against the reference kernel.
        const WeightMatrix w0{f, s.rows, s.cols, wbytes.data()};
        matmul(kernels_ref(), w0, x.data(), n, y_ref.data(), s.rows, buf_ref);
        product(pool, *kt, w0, in, y.data());
        for (size_t i = 0; i < y.size(); ++i)
          if (std::fabs(y[i] - y_ref[i]) > 1e-3 * (1 + std::fabs(y_ref[i]))) {
            std::fprintf(stderr, "kernels_bench: %s %s disagrees with the reference at %zu\n", kt->name,
                         weight_format_name(f), i);
            return 1;
          }
        const int reps = decode ? o.reps : std::max(3, o.reps / 4);
        std::vector<double> times;
        for (int rep = 0; rep < reps; ++rep) {
          const WeightMatrix w{f, s.rows, s.cols, wbytes.data() + (size_t(rep + 1) % copies) * mbytes};
          const double t0 = now_s();
          product(pool, *kt, w, in, y.data());
          times.push_back(now_s() - t0);
        }
        emit(s, n, summarize(times));
      }
    }
  }

  // One MoE layer's routed experts, grouped as Qwen35Model::moe_block runs them in decode.
  if (std::find(o.formats.begin(), o.formats.end(), WeightFormat::q8) != o.formats.end() ||
      std::find(o.formats.begin(), o.formats.end(), WeightFormat::q4) != o.formats.end()) {
    std::printf("\n| kernel | format | experts × rows each | what | bytes | best ms | median ms | GB/s best | "
                "GB/s median | %% of bw |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    const int64_t H = 1024, I = 512, top_k = 8;
    struct Group {
      int sessions;  // each routes one token to top_k experts: sessions·top_k rows in all
      int experts;   // distinct experts they reach (the bench's experts/layer/step)
    };
    const Group groups[] = {{1, 8}, {4, 26}, {8, 41}, {16, 55}};
    for (const WeightFormat f : o.formats) {
      if (f != WeightFormat::q8 && f != WeightFormat::q4) continue;
      const kiln::engine::Dtype dt = f == WeightFormat::q8 ? kiln::engine::Dtype::q8 : kiln::engine::Dtype::q4;
      const size_t gate_bytes = size_t(I) * row_bytes(f, H), down_bytes = size_t(H) * row_bytes(f, I);
      const size_t expert_bytes = 2 * gate_bytes + down_bytes;
      // Repetitions walk a shuffled pool without reuse until it wraps, 8 groups of 55 at least
      // apart, so no expert a repetition reads is still in the caches from the last one.
      const size_t pool_experts = std::max<size_t>(8 * 55, (size_t(o.pool_mib) << 20) / expert_bytes);
      std::vector<uint8_t> wbytes(pool_experts * expert_bytes);
      {
        std::vector<float> wrow(static_cast<size_t>(H));
        const size_t rows_per_expert = size_t(3 * I);
        for (size_t r = 0; r < rows_per_expert; ++r) {  // one expert, copied to the rest
          const bool down = r >= size_t(2 * I);
          const int64_t cols = down ? I : H;
          for (int64_t c = 0; c < cols; ++c) wrow[size_t(c)] = dist(rng);
          uint8_t* dst = down ? wbytes.data() + 2 * gate_bytes + (r - 2 * I) * row_bytes(f, I)
                              : wbytes.data() + r * row_bytes(f, H);
          kt->quantize[int(f)](wrow.data(), dst, cols);
        }
        for (size_t e = 1; e < pool_experts; ++e)
          std::memcpy(wbytes.data() + e * expert_bytes, wbytes.data(), expert_bytes);
      }
      std::vector<size_t> order(pool_experts);
      for (size_t e = 0; e < pool_experts; ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), std::mt19937(5));
      size_t cursor = 0;
      for (const Group& g : groups) {
        // Rows dealt to the experts as evenly as whole rows allow; row r is token r mod sessions.
        const int64_t rows_total = int64_t(g.sessions) * top_k;
        std::vector<int64_t> n(size_t(g.experts), rows_total / g.experts);
        for (int64_t e = 0; e < rows_total % g.experts; ++e) ++n[size_t(e)];
        std::vector<float> tokens_x(size_t(g.sessions * H)), xin(size_t(rows_total * H));
        std::vector<float> gu(size_t(rows_total * 2 * I)), y(size_t(rows_total * H));
        for (auto& v : tokens_x) v = dist(rng) * 30;
        for (int64_t r = 0; r < rows_total; ++r)
          std::copy_n(&tokens_x[size_t((r % g.sessions) * H)], H, &xin[size_t(r * H)]);
        std::vector<kiln::engine::Matrix> gate(size_t(g.experts)), up(gate.size()), down(gate.size());
        std::vector<kiln::engine::ops::SwigluJob> swiglu(gate.size());
        std::vector<kiln::engine::ops::MatmulJob> downs(gate.size());
        std::vector<double> times;
        for (int rep = 0; rep < o.reps; ++rep) {
          int64_t row = 0;
          for (size_t e = 0; e < gate.size(); ++e) {
            const uint8_t* base = wbytes.data() + order[cursor] * expert_bytes;
            cursor = (cursor + 1) % pool_experts;
            gate[e] = {base, dt, I, H};
            up[e] = {base + gate_bytes, dt, I, H};
            down[e] = {base + 2 * gate_bytes, dt, H, I};
            float* ge = &gu[size_t(row * 2 * I)];
            // As moe_block: an expert with one row reads its token's activations in place, so
            // experts routed the same token share one quantization of them.
            const float* x = n[e] == 1 ? &tokens_x[size_t((row % g.sessions) * H)] : &xin[size_t(row * H)];
            swiglu[e] = {&gate[e], &up[e], x, n[e], ge, ge + n[e] * I, ge};
            downs[e] = {&down[e], ge, n[e], &y[size_t(row * H)]};
            row += n[e];
          }
          const double t0 = now_s();
          kiln::engine::ops::matmul_swiglu_group(&pool, swiglu.data(), int(swiglu.size()));
          kiln::engine::ops::matmul_group(&pool, downs.data(), int(downs.size()));
          times.push_back(now_s() - t0);
        }
        const Timing t = summarize(times);
        const double bytes = double(g.experts) * double(expert_bytes);
        char shape[64], what[64];
        std::snprintf(shape, sizeof shape, "%d × %.2f", g.experts, double(rows_total) / g.experts);
        std::snprintf(what, sizeof what, "%d session%s", g.sessions, g.sessions == 1 ? "" : "s");
        std::printf("| %s | %s | %s | %s | %.2f MB | %.3f | %.3f | %.1f | %.1f | %.0f%% |\n", kernels_best().name,
                    weight_format_name(f), shape, what, bytes / 1e6, t.best * 1e3, t.median * 1e3, bytes / t.best / 1e9,
                    bytes / t.median / 1e9, 100 * bytes / t.best / 1e9 / bw.gb_per_s);
        std::fflush(stdout);
      }
    }
  }

  // Prefill attention (ops::attention): the last --attn-tokens tokens of an --attn-context-token
  // prompt against every earlier key, issue 9's bench shape (8 query / 2 KV heads of 256). Causal
  // multiply-adds: Hq·D·Σ_t (keys seen by t), twice (scores and values); GFLOP/s = 2·that / time.
  {
    const int Hq = 8, Hkv = 2, D = 256;
    const int64_t T = o.attn_tokens, n_kv = std::max<int64_t>(o.attn_context, T);
    std::vector<float> q(size_t(T * Hq * D)), k(size_t(n_kv * Hkv * D)), v(k.size()), out(q.size());
    for (auto* buf : {&q, &k, &v})
      for (auto& e : *buf) e = dist(rng) * 30;
    double macs = 0;
    for (int64_t t = 0; t < T; ++t) macs += 2.0 * Hq * D * double(n_kv - T + t + 1);
    std::vector<double> times;
    for (int rep = 0; rep < std::max(3, o.reps / 4); ++rep) {
      const double t0 = now_s();
      kiln::engine::ops::attention(&pool, q.data(), k.data(), v.data(), T, n_kv, Hq, Hkv, D, 1.0f / 16, out.data());
      times.push_back(now_s() - t0);
    }
    const Timing t = summarize(times);
    std::printf("\n| op | shape | best ms | median ms | GFLOP/s best |\n|---|---|---:|---:|---:|\n");
    std::printf("| prefill attention | %lld queries over %lld keys, %d/%d heads of %d | %.2f | %.2f | %.1f |\n",
                static_cast<long long>(T), static_cast<long long>(n_kv), Hq, Hkv, D, t.best * 1e3, t.median * 1e3,
                2 * macs / t.best / 1e9);
  }
  return 0;
}
