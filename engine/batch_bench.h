// The batching measurement (`kiln engine bench --sessions 1,2,4,8,16`): for each concurrency n,
// n sessions (each on its own thread, as agents are) prefill a prompt and then generate together
// through the scheduler. Reported per n: aggregate and per-session decode tokens/s, the mean
// step time, distinct routed experts read per MoE layer per step (the expert-union effect), and
// the tokens/s of one more session's prefill admitted while the n decode. Then the fairness check
// of issue 10: a long prefill (4,096 tokens) admitted while 4 sessions decode, with their worst
// step time before and during it against the worst chunk of that prefill run alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/cache/kv_pool.h"
#include "engine/cpu/quant.h"
#include "engine/status.h"

namespace kiln::engine {

struct BatchBenchOptions {
  std::string model_dir;
  std::optional<cpu::WeightFormat> weights = cpu::WeightFormat::q8;  // nullopt: as stored
  int threads = 0;
  CacheDtype cache_dtype = CacheDtype::f32;  // KV and conv cache
  std::vector<int> sessions = {1, 2, 4, 8, 16};
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 32;
  int runs = 1;  // decode rounds per concurrency (gen_tokens each); the median round is reported
  int64_t prefill_chunk = 512;
  int64_t fairness_prompt_tokens = 4096;  // 0: skip the fairness check
  int fairness_decoders = 4;  // 0: the prefill alone twice, a control for the machine's drift
  uint64_t seed = 1;
  bool progress = false;
};

struct BatchBenchRow {
  int n = 0;
  double aggregate_tok_s = 0;     // n · gen_tokens / wall time of the decode phase
  double per_session_tok_s = 0;   // mean over sessions of gen_tokens / that session's own time
  double step_ms = 0;             // mean step time in the decode phase
  double experts_per_layer = 0;   // distinct routed experts read per MoE layer per step
  double prefill_tok_s = 0;       // a prompt_tokens prefill while the n sessions decode
  double prefill_step_ms = 0;     // mean step time while that prefill ran
  // Bytes a decode step reads: the non-expert weights, each distinct routed expert once, and
  // every session's state. A batch of n can be at most `bytes_bound_x` times one session's
  // aggregate rate at the same bandwidth (n × one token's bytes / the step's); achieved_gb_s is
  // bytes_per_step / step time.
  uint64_t bytes_per_step = 0;
  double achieved_gb_s = 0;
  double bytes_bound_x = 0;
};

struct FairnessReport {
  int decoders = 0;
  int64_t prompt_tokens = 0, chunk_tokens = 0;
  double worst_step_before_ms = 0;  // decode-only steps just before the prefill
  double worst_step_during_ms = 0;  // steps that carried a prefill chunk
  double chunk_alone_ms = 0;        // worst step of the same prefill run with nothing else
  double raise_ms() const { return worst_step_during_ms - worst_step_before_ms; }
  // Chunk by chunk: what a step carrying chunk k (with the decoders) took beyond chunk k alone,
  // i.e. what the decoders added to it, whichever chunk is the slowest: the mean over chunks
  // (robust to the machine's drift between the two runs) and the most. Made only when both runs
  // cut the prefill the same way (same_cut).
  int chunks = 0;
  bool same_cut = false;
  double mean_extra_ms = 0, worst_extra_ms = 0;
  double prefill_s = 0;             // the long prefill's own duration
};

struct BatchBenchReport {
  std::string weights;
  std::string cache_dtype;  // "f32" or "bf16"
  int threads = 0;
  int64_t prompt_tokens = 0, gen_tokens = 0, prefill_chunk = 0;
  int runs = 1;  // decode rounds per concurrency; rows hold the median round
  std::vector<BatchBenchRow> rows;
  std::optional<FairnessReport> fairness;

  std::string to_json() const;                           // {"sessions": [{"n": …, …}], "fairness": {…}}
  std::string to_table(const std::string& command) const;  // markdown, with the command line
};

Result<BatchBenchReport> run_batch_bench(const BatchBenchOptions& options);

}  // namespace kiln::engine
