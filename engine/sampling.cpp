#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln::engine {

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> seen) {
  int64_t V = int64_t(logits.size());
  if (p_.vocab_limit > 0) V = std::min(V, p_.vocab_limit);
  work_.assign(logits.begin(), logits.begin() + V);
  if (p_.presence_penalty != 0.0f)
    for (int32_t t : seen)
      if (t >= 0 && t < V && !std::isinf(work_[size_t(t)])) work_[size_t(t)] = logits[size_t(t)] - p_.presence_penalty;
  if (p_.temperature <= 0.0f) return int32_t(std::max_element(work_.begin(), work_.end()) - work_.begin());

  // Candidates sorted by logit, cut by top-k, then softmax at the temperature, then top-p/min-p.
  ids_.resize(size_t(V));
  std::iota(ids_.begin(), ids_.end(), 0);
  int64_t n = V;
  if (p_.top_k > 0 && p_.top_k < n) n = p_.top_k;
  auto by_logit = [&](int32_t a, int32_t b) { return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b); };
  std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), by_logit);
  ids_.resize(size_t(n));
  std::vector<double> prob(static_cast<size_t>(n));
  const double mx = work_[size_t(ids_[0])];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (prob[size_t(i)] = std::exp((work_[size_t(ids_[size_t(i)])] - mx) / p_.temperature));
  for (auto& q : prob) q /= sum;
  int64_t keep = n;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < n; ++i) {
      cum += prob[size_t(i)];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p_.min_p > 0.0f) {
    int64_t m = 1;
    while (m < keep && prob[size_t(m)] >= p_.min_p * prob[0]) ++m;
    keep = m;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[size_t(i)];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[size_t(i)];
    if (r <= 0) return ids_[size_t(i)];
  }
  return ids_[size_t(keep - 1)];
}

}  // namespace kiln::engine
