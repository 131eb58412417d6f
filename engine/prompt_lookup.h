// Prompt-lookup drafting: speculative decoding without a draft model. An agent's output often
// repeats its context (the text of a file it read, quoted back in an edit; a path; a test name),
// so the tokens that followed the last earlier occurrence of the current suffix are a cheap guess
// at what comes next. The scheduler verifies a draft in one step (engine/scheduler.h) and keeps
// the tokens the model itself would have produced: the output is the same with or without it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::engine {

struct SpeculativeOptions {
  int draft_tokens = 0;  // most tokens proposed per step; 0: off
  int min_match = 2;     // shortest suffix that must recur for a draft
  int max_match = 4;     // longest suffix tried (the longest that recurs wins)
};

// Fills `draft` (cleared first) with up to `max_tokens` tokens that followed the most recent
// earlier occurrence of the longest suffix (max_match down to min_match tokens) of
// history + [next]; empty when none recurs. Looks back at most `window` tokens.
void propose_draft(std::span<const int32_t> history, int32_t next, const SpeculativeOptions& options,
                   int64_t max_tokens, std::vector<int32_t>& draft, int64_t window = 1 << 16);

}  // namespace kiln::engine
