#include "engine/prompt_lookup.h"

#include <algorithm>
#include <cmath>

namespace kiln::engine {

void propose_draft(std::span<const int32_t> history, int32_t next, const SpeculativeOptions& options,
                   int64_t max_tokens, std::vector<int32_t>& draft, int64_t window) {
  draft.clear();
  max_tokens = std::min<int64_t>(max_tokens, options.draft_tokens);
  if (max_tokens <= 0 || options.min_match < 1) return;
  // The searched text is history followed by `next`, without copying it.
  const int64_t n = int64_t(history.size()) + 1;
  auto at = [&](int64_t i) { return i == n - 1 ? next : history[size_t(i)]; };
  const int64_t lo = std::max<int64_t>(0, n - window);
  for (int64_t m = std::min<int64_t>(options.max_match, n - 1); m >= options.min_match; --m) {
    // An occurrence at j (j + m ≤ n − 1, so at least one token follows it), the latest first.
    for (int64_t j = n - 1 - m; j >= lo; --j) {
      if (history[size_t(j + m - 1)] != next) continue;  // its last token, the likeliest mismatch
      bool same = true;
      for (int64_t i = 0; i + 1 < m && same; ++i) same = history[size_t(j + i)] == at(n - m + i);
      if (!same) continue;
      for (int64_t i = j + m; i < n && int64_t(draft.size()) < max_tokens; ++i) draft.push_back(at(i));
      return;
    }
  }
}

int64_t draft_length(double acceptance, double tokens, int64_t rows, int64_t available,
                     const std::function<double(int64_t)>& cost, double* expected) {
  double best = tokens / cost(rows), sum = 0, best_sum = 0;
  int64_t best_k = 0;
  for (int64_t k = 1; k <= available; ++k) {
    sum += std::pow(acceptance, double(k));
    const double v = (tokens + sum) / cost(rows + k);
    if (v > best) best = v, best_k = k, best_sum = sum;
  }
  if (expected) *expected = best_sum;
  return best_k;
}

}  // namespace kiln::engine
