#include "engine/batch_bench.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/speed_bench.h"
#include "engine/weights/quantized_weights.h"

namespace kiln::engine {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Window {
  double mean_ms = 0, worst_ms = 0, experts_per_layer = 0;
  int steps = 0;
};

// Step statistics over the log entries selected by `keep`.
template <class Keep>
Window summarize(const std::vector<StepRecord>& log, Keep keep) {
  Window w;
  double total = 0;
  int64_t experts = 0, layers = 0;
  for (const StepRecord& r : log) {
    if (!keep(r)) continue;
    ++w.steps, total += r.ms, w.worst_ms = std::max(w.worst_ms, r.ms);
    experts += r.stats.experts_read, layers += r.stats.moe_layers;
  }
  w.mean_ms = w.steps ? total / w.steps : 0;
  w.experts_per_layer = layers ? double(experts) / double(layers) : 0;
  return w;
}

// Runs fn(i) on n threads that start together; returns when all are done.
template <class Fn>
void on_threads(int n, Fn fn) {
  std::barrier start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      fn(i);
    });
  for (auto& t : threads) t.join();
}

}  // namespace

Result<BatchBenchReport> run_batch_bench(const BatchBenchOptions& o) {
  if (o.sessions.empty() || *std::min_element(o.sessions.begin(), o.sessions.end()) < 1)
    return make_error("bench: --sessions needs one or more counts of at least 1");
  if (o.prompt_tokens < 1 || o.gen_tokens < 1) return make_error("bench: prompt and gen tokens must be at least 1");
  if (o.fairness_decoders < 0) return make_error("bench: --fairness-decoders must be at least 0");
  const int max_n = *std::max_element(o.sessions.begin(), o.sessions.end());
  EngineOptions eo;
  eo.threads = o.threads;
  eo.weights = o.weights;
  eo.cache_dtype = o.cache_dtype;
  eo.progress = o.progress;
  eo.prefill_chunk = o.prefill_chunk;
  eo.max_sessions = std::max(max_n, o.fairness_decoders) + 1;
  eo.kv_budget_bytes = int64_t(8) << 30;  // pages are allocated on first use
  auto model = Model::load(o.model_dir, eo);
  if (!model) return make_error(model.error());
  Model& m = **model;
  const ModelConfig& c = m.config();
  if (o.prompt_tokens + 2 * o.gen_tokens > c.max_position_embeddings)
    return make_error("bench: prompt + 2 × gen tokens exceed max_position_embeddings = " +
                      std::to_string(c.max_position_embeddings));
  BatchBenchReport report;
  report.weights = o.weights ? cpu::weight_format_name(*o.weights) : std::string("as stored");
  report.cache_dtype = cache_dtype_name(m.options().cache_dtype);
  report.threads = m.thread_pool().size();
  report.prompt_tokens = o.prompt_tokens, report.gen_tokens = o.gen_tokens, report.prefill_chunk = o.prefill_chunk;
  report.runs = std::max(1, o.runs);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab_size - 1));
  auto prompt = [&](int64_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = tok(rng);
    return p;
  };
  GenerateOptions greedy;
  greedy.max_tokens = o.gen_tokens;
  Scheduler& sched = m.scheduler();

  for (int n : o.sessions) {
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < n; ++i) {
      auto s = m.open_session();
      if (!s) return make_error(s.error());
      sessions.push_back(std::move(s).value());
      prompts.push_back(prompt(o.prompt_tokens));
    }
    std::string error;
    std::mutex error_mu;
    auto check = [&](bool ok, const std::string& e) {
      if (ok) return;
      std::lock_guard<std::mutex> lock(error_mu);
      error = e;
    };
    on_threads(n, [&](int i) {
      auto r = sessions[size_t(i)]->append(prompts[size_t(i)]);
      check(r.ok(), r.ok() ? "" : r.error());
    });
    // Decode: all n generate gen_tokens together, `runs` rounds in a row; the round with the
    // median aggregate rate is reported (a busy machine slows single rounds by up to 2×).
    std::vector<BatchBenchRow> rounds;
    for (int round = 0; round < std::max(1, o.runs); ++round) {
      std::vector<double> begin(static_cast<size_t>(n)), end(static_cast<size_t>(n));
      sched.clear_step_log();
      on_threads(n, [&](int i) {
        begin[size_t(i)] = now_s();
        auto r = sessions[size_t(i)]->generate(greedy);
        end[size_t(i)] = now_s();
        check(r.ok(), r.ok() ? "" : r.error());
      });
      if (!error.empty()) return make_error(error);
      BatchBenchRow round_row;
      round_row.n = n;
      const double wall = *std::max_element(end.begin(), end.end()) - *std::min_element(begin.begin(), begin.end());
      round_row.aggregate_tok_s = double(n * o.gen_tokens) / wall;
      for (int i = 0; i < n; ++i)
        round_row.per_session_tok_s += double(o.gen_tokens) / (end[size_t(i)] - begin[size_t(i)]) / n;
      const Window decode = summarize(sched.step_log(), [](const StepRecord&) { return true; });
      round_row.step_ms = decode.mean_ms;
      round_row.experts_per_layer = decode.experts_per_layer;
      // The state at this round's mean position (each round decodes gen_tokens further).
      const uint64_t state = decode_state_bytes(m, o.prompt_tokens + int64_t(round) * o.gen_tokens + o.gen_tokens / 2);
      const uint64_t one_token = weight_bytes_per_token(m.weights(), c.num_experts_per_tok) + state;
      round_row.bytes_per_step =
          weight_bytes_per_token(m.weights(), c.is_moe ? decode.experts_per_layer : 0.0) + uint64_t(n) * state;
      round_row.achieved_gb_s = decode.mean_ms > 0 ? double(round_row.bytes_per_step) / decode.mean_ms / 1e6 : 0;
      round_row.bytes_bound_x = double(n) * double(one_token) / double(round_row.bytes_per_step);
      rounds.push_back(round_row);
    }
    std::sort(rounds.begin(), rounds.end(),
              [](const BatchBenchRow& a, const BatchBenchRow& b) { return a.aggregate_tok_s < b.aggregate_tok_s; });
    BatchBenchRow row = rounds[rounds.size() / 2];
    // One more session prefills while the n decode again.
    auto extra = m.open_session();
    if (!extra) return make_error(extra.error());
    const auto long_prompt = prompt(o.prompt_tokens);
    sched.clear_step_log();
    double prefill_s = 0;
    on_threads(n + 1, [&](int i) {
      if (i < n) {
        auto r = sessions[size_t(i)]->generate(greedy);
        return check(r.ok(), r.ok() ? "" : r.error());
      }
      while (sched.step_log().empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      const double a = now_s();
      auto r = (*extra)->append(long_prompt);
      prefill_s = now_s() - a;
      check(r.ok(), r.ok() ? "" : r.error());
    });
    if (!error.empty()) return make_error(error);
    row.prefill_tok_s = double(o.prompt_tokens) / prefill_s;
    row.prefill_step_ms = summarize(sched.step_log(), [](const StepRecord& r) { return r.prefill_rows > 0; }).mean_ms;
    report.rows.push_back(row);
    if (o.progress) std::fprintf(stderr, "bench: %d sessions: %.1f tok/s aggregate\n", n, row.aggregate_tok_s);
  }

  if (o.fairness_prompt_tokens > 0) {
    const int64_t P = o.fairness_prompt_tokens, D = o.fairness_decoders, short_prompt = 64;
    if (P > c.max_position_embeddings || short_prompt + 64 > c.max_position_embeddings)
      return make_error("bench: the fairness prompt of " + std::to_string(P) + " tokens exceeds max_position_embeddings");
    FairnessReport f;
    f.decoders = int(D), f.prompt_tokens = P, f.chunk_tokens = std::min(P, o.prefill_chunk);
    std::vector<std::unique_ptr<Session>> decoders;
    for (int i = 0; i < D; ++i) {
      auto s = m.open_session();
      if (!s) return make_error(s.error());
      if (auto r = (*s)->append(prompt(short_prompt)); !r) return make_error(r.error());
      decoders.push_back(std::move(s).value());
    }
    std::atomic<bool> stop{false};
    std::string error;
    std::mutex error_mu;
    GenerateOptions endless;
    endless.max_tokens = c.max_position_embeddings - short_prompt;
    auto long_prompt = prompt(P);
    auto big = m.open_session();
    if (!big) return make_error(big.error());
    double t_prefill = 0;
    on_threads(int(D) + 1, [&](int i) {
      if (i < D) {
        auto r = decoders[size_t(i)]->generate(endless, [&](int32_t) { return !stop.load(); });
        std::lock_guard<std::mutex> lock(error_mu);
        if (!r) error = r.error();
        return;
      }
      sched.clear_step_log();
      while (D > 0 && sched.step_log().size() < 8) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      t_prefill = now_s();
      auto r = (*big)->append(long_prompt);
      f.prefill_s = now_s() - t_prefill;
      stop = true;
      std::lock_guard<std::mutex> lock(error_mu);
      if (!r) error = r.error();
    });
    if (!error.empty()) return make_error(error);
    const auto log = sched.step_log();
    f.worst_step_before_ms =
        summarize(log, [&](const StepRecord& r) { return r.prefill_rows == 0 && r.start_s < t_prefill; }).worst_ms;
    f.worst_step_during_ms = summarize(log, [](const StepRecord& r) { return r.prefill_rows > 0; }).worst_ms;
    decoders.clear();
    big->reset();
    // The same prefill with nothing else running: its worst chunk (the last ones attend to the
    // most positions) is "one chunk's time" at those positions.
    auto alone = m.open_session();
    if (!alone) return make_error(alone.error());
    sched.clear_step_log();
    if (auto r = (*alone)->append(long_prompt); !r) return make_error(r.error());
    const auto alone_log = sched.step_log();
    f.chunk_alone_ms = summarize(alone_log, [](const StepRecord&) { return true; }).worst_ms;
    std::vector<StepRecord> during;
    for (const StepRecord& r : log)
      if (r.prefill_rows > 0) during.push_back(r);
    f.chunks = int(alone_log.size());
    f.same_cut = !during.empty() && std::equal(during.begin(), during.end(), alone_log.begin(), alone_log.end(),
                                               [](const StepRecord& a, const StepRecord& b) {
                                                 return a.prefill_rows == b.prefill_rows;
                                               });
    if (f.same_cut)
      for (size_t k = 0; k < during.size(); ++k) {
        const double extra = during[k].ms - alone_log[k].ms;
        f.worst_extra_ms = k == 0 ? extra : std::max(f.worst_extra_ms, extra);
        f.mean_extra_ms += extra / double(during.size());
      }
    report.fairness = f;
  }
  return report;
}

std::string BatchBenchReport::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const BatchBenchRow& r : rows)
    rows_json.push_back({{"n", r.n},
                         {"aggregate_tok_s", r.aggregate_tok_s},
                         {"per_session_tok_s", r.per_session_tok_s},
                         {"step_ms", r.step_ms},
                         {"experts_per_layer", r.experts_per_layer},
                         {"prefill_tok_s", r.prefill_tok_s},
                         {"prefill_step_ms", r.prefill_step_ms},
                         {"bytes_per_step", r.bytes_per_step},
                         {"achieved_gb_s", r.achieved_gb_s},
                         {"bytes_bound_x", r.bytes_bound_x}});
  nlohmann::json j{{"weights", weights},
                   {"cache_dtype", cache_dtype},
                   {"threads", threads},
                   {"prompt_tokens", prompt_tokens},
                   {"gen_tokens", gen_tokens},
                   {"runs", runs},
                   {"prefill_chunk", prefill_chunk},
                   {"sessions", rows_json}};
  if (fairness)
    j["fairness"] = {{"decoders", fairness->decoders},
                     {"prompt_tokens", fairness->prompt_tokens},
                     {"chunk_tokens", fairness->chunk_tokens},
                     {"worst_step_before_ms", fairness->worst_step_before_ms},
                     {"worst_step_during_ms", fairness->worst_step_during_ms},
                     {"raise_ms", fairness->raise_ms()},
                     {"chunk_alone_ms", fairness->chunk_alone_ms},
                     {"chunks", fairness->chunks},
                     {"same_cut", fairness->same_cut},
                     {"worst_extra_ms", fairness->worst_extra_ms},
                     {"mean_extra_ms", fairness->mean_extra_ms},
                     {"prefill_s", fairness->prefill_s}};
  return j.dump();
}

std::string BatchBenchReport::to_table(const std::string& command) const {
  std::string out = "`" + command + "`\n\nweights " + weights + ", cache " + cache_dtype + ", " +
                    std::to_string(threads) + " threads, prompt " + std::to_string(prompt_tokens) + ", gen " +
                    std::to_string(gen_tokens) +
                    (runs > 1 ? " (median of " + std::to_string(runs) + " rounds)" : std::string()) +
                    ", prefill chunk " + std::to_string(prefill_chunk) + "\n\n";
  out +=
      "| sessions | aggregate tok/s | per-session tok/s | × 1 session | bytes bound × | step ms | MB/step | GB/s | "
      "experts/layer/step | prefill tok/s while decoding |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (const BatchBenchRow& r : rows) {
    const double base = rows.empty() || rows[0].n != 1 ? 0 : rows[0].aggregate_tok_s;
    std::snprintf(buf, sizeof buf, "| %d | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r.n,
                  r.aggregate_tok_s, r.per_session_tok_s, base > 0 ? r.aggregate_tok_s / base : 0.0, r.bytes_bound_x,
                  r.step_ms, double(r.bytes_per_step) / 1e6, r.achieved_gb_s, r.experts_per_layer, r.prefill_tok_s);
    out += buf;
  }
  if (fairness) {
    const FairnessReport& f = *fairness;
    std::snprintf(buf, sizeof buf,
                  "\nfairness: a %lld-token prefill (chunks of %lld) admitted while %d sessions decode: their worst "
                  "step %.1f ms before, %.1f ms during (+%.1f ms); the worst chunk of that prefill alone %.1f ms; prefill took %.1f s\n",
                  static_cast<long long>(f.prompt_tokens), static_cast<long long>(f.chunk_tokens), f.decoders,
                  f.worst_step_before_ms, f.worst_step_during_ms, f.raise_ms(), f.chunk_alone_ms, f.prefill_s);
    out += buf;
    if (f.same_cut) {
      std::snprintf(buf, sizeof buf,
                    "chunk by chunk (%d chunks): a step carrying chunk k and the decoders took %+.1f ms on average "
                    "and at most %+.1f ms beyond chunk k alone\n",
                    f.chunks, f.mean_extra_ms, f.worst_extra_ms);
      out += buf;
    }
  }
  return out;
}

}  // namespace kiln::engine
