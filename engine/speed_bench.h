// The engine's own speed measurement (`kiln engine bench`, bench/engine_speed_bench): prefill and
// decode tokens/s of one model on this machine, bytes read per decoded token, and the achieved
// bandwidth against the read bandwidth measured on the spot with the same thread count. Runs
// follow one untimed warm-up, so the first is not the one that faults the weights in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/cache/kv_pool.h"
#include "engine/cpu/quant.h"
#include "engine/status.h"

namespace kiln::engine {

struct SpeedBenchOptions {
  std::string model_dir;
  std::optional<cpu::WeightFormat> weights = cpu::WeightFormat::q8;  // nullopt: as stored
  int threads = 0;            // 0: all hardware threads
  CacheDtype cache_dtype = CacheDtype::f32;  // KV and conv cache
  int64_t prompt_tokens = 512;
  int64_t gen_tokens = 128;
  int runs = 3;               // prefill and decode are each the median of this many runs
  uint64_t seed = 1;          // prompt token ids are drawn from it
  bool progress = false;      // quantization progress bar on stderr
  size_t bandwidth_buffer_bytes = size_t{1} << 30;  // the read-bandwidth probe's buffer (≫ caches)
  // > 0: also time speculative verification steps (a token and 1..draft_tokens draft tokens, in
  // the decode form) at the end of the prompt, against a plain decode step.
  int draft_tokens = 0;
};

// One row of the verification cost: a step that forwards a token and `draft_tokens` drafts.
struct VerifyCost {
  int draft_tokens = 0;
  double step_ms = 0;            // median over runs × 16 steps
  double vs_decode = 0;          // step_ms / the plain decode step's
  double experts_per_layer = 0;  // distinct routed experts read per MoE layer
};

struct SpeedBenchReport {
  std::string weights;  // "q8", "as stored (BF16)", ...
  std::string cache_dtype;  // "f32" or "bf16"
  int threads = 0;
  int64_t prompt_tokens = 0, gen_tokens = 0;
  double load_s = 0;
  double prefill_tok_s = 0;             // median over runs
  double decode_tok_s = 0;              // median over runs
  std::vector<double> decode_runs_tok_s;
  uint64_t weight_bytes_per_token = 0;  // matrices read per decoded token (top-k experts only)
  uint64_t state_bytes_per_token = 0;   // GDN states + KV at the mean decode position
  uint64_t bytes_per_token = 0;         // the sum
  double achieved_gb_s = 0;             // bytes_per_token × decode_tok_s
  double measured_gb_s = 0;             // read bandwidth, same thread count
  double bandwidth_fraction = 0;
  std::vector<VerifyCost> verify;      // row 0: the plain decode step (draft_tokens 0)

  std::string to_json() const;   // one object with the keys above
  std::string to_table() const;  // a markdown table
};

Result<SpeedBenchReport> run_speed_bench(const SpeedBenchOptions& options);

class Model;
// State bytes one sequence reads per decoded token: its GDN recurrent and conv states and the KV
// of the full-attention layers at `n_ctx` positions.
uint64_t decode_state_bytes(const Model& m, int64_t n_ctx);

}  // namespace kiln::engine
