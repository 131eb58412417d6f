// Comparing models on the same tasks: per-model summaries and pairwise McNemar tests.
// SQL fetches the finished builds; the statistics are plain C++ over them so they can be read
// (and tested) without a database.
#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "store/store_impl.h"

namespace kiln::store {
namespace {

std::optional<double> median(std::vector<double> v) {
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Nearest-rank percentile: the smallest value with at least p of the data at or below it.
std::optional<double> percentile_nearest_rank(std::vector<double> v, double p) {
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

struct Finished {
  std::string model;
  std::string task_key;
  bool succeeded;
  double wall_s;
  int64_t tokens_generated;
  double seconds_decode;
};

}  // namespace

double mcnemar_exact_p(int64_t b, int64_t c) {
  int64_t n = b + c;
  if (n <= 0) return 1.0;
  int64_t k = std::min(b, c);
  double tail = 0;  // P(X <= k), X ~ Binomial(n, 1/2)
  if (n <= 1000) {
    // C(n, i) fits a double (C(1000, 500) ~ 2^995), and is exact up to 2^53, so small tables
    // give exactly the hand-computed values; ldexp scales by 2^-n without underflow.
    double choose = 1, sum = 0;
    for (int64_t i = 0; i <= k; ++i) {
      sum += choose;
      choose = choose * static_cast<double>(n - i) / static_cast<double>(i + 1);
    }
    tail = std::ldexp(sum, -static_cast<int>(n));
  } else {
    // Log space for large n, where the terms themselves would overflow.
    double log_half_n = static_cast<double>(n) * std::log(0.5);
    for (int64_t i = 0; i <= k; ++i) {
      tail += std::exp(std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
                       std::lgamma(static_cast<double>(n - i) + 1) + log_half_n);
    }
  }
  return std::min(1.0, 2.0 * tail);
}

Result<CompareReport> Store::compare(const CompareQuery& query) {
  std::vector<Finished> rows;
  Status fetched = impl_->read([&](detail::Db& db) -> Status {
    rows.clear();
    // Cancelled builds say nothing about a model, nor do kiln's own failures (infra_error: a
    // clone, the sandbox, a lost lease), so they are left out. Wall time is the worker's
    // measurement when it gave one, else finish minus latest claim.
    Result<detail::Query> q = db.query(
        "SELECT b.model, b.task_key, b.status = 'succeeded', "
        "CASE WHEN m.seconds_wall > 0 THEN m.seconds_wall "
        "     ELSE (b.finished_ms - COALESCE(b.started_ms, b.created_ms)) / 1000.0 END, "
        "m.tokens_generated, m.seconds_decode "
        "FROM builds b JOIN build_metrics m ON m.build_id = b.id "
        "WHERE b.status IN ('succeeded', 'failed', 'error') AND b.outcome IS NOT 'infra_error' "
        "AND (?1 IS NULL OR b.finished_ms >= ?1) "
        "ORDER BY b.finished_ms, b.id");
    if (!q) return q.error();
    q->bind(1, query.since_ms);
    while (true) {
      Result<bool> row = q->step();
      if (!row) return row.error();
      if (!*row) break;
      rows.push_back({q->text(0), q->text(1), q->i64(2) != 0, q->f64(3), q->i64(4), q->f64(5)});
    }
    return {};
  });
  if (!fetched) return fetched.error();

  std::vector<std::string> models = query.models;
  if (models.empty()) {
    for (const Finished& f : rows) models.push_back(f.model);
  }
  std::sort(models.begin(), models.end());
  models.erase(std::unique(models.begin(), models.end()), models.end());

  CompareReport report;
  // model -> task_key -> latest finished build (rows are in finish order, so later overwrite).
  std::unordered_map<std::string, std::unordered_map<std::string, const Finished*>> latest;
  for (const std::string& model : models) {
    ModelStats s;
    s.model = model;
    std::vector<double> walls, tokens;
    int64_t sum_tokens = 0;
    double sum_decode = 0;
    for (const Finished& f : rows) {
      if (f.model != model) continue;
      ++s.builds;
      s.succeeded += f.succeeded ? 1 : 0;
      if (f.succeeded) walls.push_back(f.wall_s);
      tokens.push_back(static_cast<double>(f.tokens_generated));
      sum_tokens += f.tokens_generated;
      sum_decode += f.seconds_decode;
      latest[model][f.task_key] = &f;
    }
    if (s.builds > 0) s.success_rate = static_cast<double>(s.succeeded) / static_cast<double>(s.builds);
    s.median_wall_s = median(walls);
    s.p90_wall_s = percentile_nearest_rank(walls, 0.9);
    s.median_tokens_generated = median(tokens);
    if (sum_decode > 0) s.decode_tokens_per_s = static_cast<double>(sum_tokens) / sum_decode;
    report.models.push_back(std::move(s));
  }

  for (size_t i = 0; i < models.size(); ++i) {
    for (size_t j = i + 1; j < models.size(); ++j) {
      PairStats p;
      p.model_a = models[i];
      p.model_b = models[j];
      std::vector<double> ratios;
      for (const auto& [task, a] : latest[models[i]]) {
        auto it = latest[models[j]].find(task);
        if (it == latest[models[j]].end()) continue;
        const Finished* b = it->second;
        ++p.tasks;
        if (a->succeeded && b->succeeded)
          ++p.both_succeeded;
        else if (a->succeeded)
          ++p.only_a;
        else if (b->succeeded)
          ++p.only_b;
        else
          ++p.both_failed;
        // Time only means something where both did the task.
        if (a->succeeded && b->succeeded && b->wall_s > 0) ratios.push_back(a->wall_s / b->wall_s);
      }
      p.mcnemar_p = mcnemar_exact_p(p.only_a, p.only_b);
      p.median_wall_ratio = median(ratios);
      report.pairs.push_back(std::move(p));
    }
  }
  return report;
}

}  // namespace kiln::store
