// Prompt-lookup drafting: speculative decoding without a draft model. An agent's output often
// repeats its context (the text of a file it read, quoted back in an edit; a path; a test name),
// so the tokens that followed the last earlier occurrence of the current suffix are a cheap guess
// at what comes next. The scheduler verifies a draft in one step (engine/scheduler.h) and keeps
// the tokens the model itself would have produced: the output is the same with or without it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kiln::engine {

struct SpeculativeOptions {
  int draft_tokens = 0;  // most tokens proposed per step; 0: off
  int min_match = 2;     // shortest suffix that must recur for a draft
  int max_match = 4;     // longest suffix tried (the longest that recurs wins)
  // true: a draft is verified only as far as it is expected to pay (draft_length below); false:
  // the whole draft every time (tests and measurements).
  bool adaptive = true;
};

// Fills `draft` (cleared first) with up to `max_tokens` tokens that followed the most recent
// earlier occurrence of the longest suffix (max_match down to min_match tokens) of
// history + [next]; empty when none recurs. Looks back at most `window` tokens.
void propose_draft(std::span<const int32_t> history, int32_t next, const SpeculativeOptions& options,
                   int64_t max_tokens, std::vector<int32_t>& draft, int64_t window = 1 << 16);

// How many of `available` draft tokens to verify in a step that already holds `rows` rows and is
// expected to yield `tokens` tokens: the k (0 = none) that maximises the expected tokens per
// unit of time, (tokens + Σ_{i≤k} acceptance^i) / cost(rows + k), with cost(n) the duration of a
// step of n rows. `expected` receives Σ_{i≤k} acceptance^i for the chosen k.
int64_t draft_length(double acceptance, double tokens, int64_t rows, int64_t available,
                     const std::function<double(int64_t)>& cost, double* expected = nullptr);

}  // namespace kiln::engine
