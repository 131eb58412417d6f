#include "engine/speed_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/cpu/bandwidth.h"
#include "engine/engine.h"
#include "engine/weights/quantized_weights.h"

namespace kiln::engine {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int32_t argmax(std::span<const float> v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}


// Steps of a token and k = 0..max_draft draft tokens, run as the scheduler runs a verification
// (sequential: each position in the decode form, recording what a GDN rollback replays) at the end of the
// prompt; the sequence is set back after each step so every step sees the same context.
Result<std::vector<VerifyCost>> verify_costs(Model& m, const std::vector<int32_t>& prompt, int max_draft, int runs) {
  const int64_t V = m.config().vocab_size;
  SequenceState st;
  st.dtype = m.options().cache_dtype;
  st.kv = std::make_unique<SequenceKv>(m.kv_pool());
  m.network().init_state(st);
  const int64_t T_max = 1 + max_draft;
  if (Status s = st.kv->reserve(int64_t(prompt.size()) + T_max); !s)
    return make_error("bench: " + s.error());
  std::vector<float> logits(size_t(T_max * V));
  m.network().forward(prompt.data(), int64_t(prompt.size()), st, false, logits.data());
  GdnRollback saved;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1));
  std::vector<VerifyCost> out;
  for (int k = 0; k <= max_draft; ++k) {
    const int64_t T = 1 + k;
    std::vector<double> ms;
    int64_t experts = 0, moe_layers = 0;
    for (int run = 0; run < std::max(runs, 1) * 16; ++run) {
      std::vector<int32_t> tokens(static_cast<size_t>(T));
      for (auto& t : tokens) t = tok(rng);
      const SeqStep step{tokens.data(), T, &st, LogitRows::all, logits.data(), T > 1, &saved};
      StepStats stats;
      const double a = now_s();
      m.network().forward_batch(std::span<const SeqStep>(&step, 1), &stats);
      ms.push_back((now_s() - a) * 1e3);
      st.n_past -= T;
      experts += stats.experts_read, moe_layers += stats.moe_layers;
    }
    VerifyCost c;
    c.draft_tokens = k;
    c.step_ms = median(ms);
    c.vs_decode = out.empty() ? 1.0 : c.step_ms / out[0].step_ms;
    c.experts_per_layer = moe_layers > 0 ? double(experts) / double(moe_layers) : 0;
    out.push_back(c);
  }
  return out;
}

}  // namespace

uint64_t decode_state_bytes(const Model& m, int64_t n_ctx) {
  const ModelConfig& c = m.config();
  const uint64_t gdn = uint64_t(c.n_linear_layers()) *
                       (uint64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4 +
                        uint64_t(c.linear_conv_kernel_dim - 1) * c.conv_dim() * cache_dtype_size(m.options().cache_dtype));
  const uint64_t kv = uint64_t(c.n_full_layers()) * uint64_t(n_ctx) * 2 * c.kv_dim() * cache_dtype_size(m.options().cache_dtype);
  return gdn + kv;
}

Result<SpeedBenchReport> run_speed_bench(const SpeedBenchOptions& o) {
  if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.runs < 1)
    return make_error("bench: prompt tokens, gen tokens and runs must be at least 1");
  EngineOptions eo;
  eo.threads = o.threads;
  eo.weights = o.weights;
  eo.cache_dtype = o.cache_dtype;
  eo.progress = o.progress;
  eo.max_sessions = 1;
  eo.kv_budget_bytes = int64_t(4) << 30;
  const double t0 = now_s();
  auto model = Model::load(o.model_dir, eo);
  if (!model) return make_error(model.error());
  Model& m = **model;
  SpeedBenchReport r;
  r.load_s = now_s() - t0;
  r.threads = m.thread_pool().size();
  r.prompt_tokens = o.prompt_tokens;
  r.gen_tokens = o.gen_tokens;
  r.cache_dtype = cache_dtype_name(m.options().cache_dtype);
  r.weights = o.weights ? cpu::weight_format_name(*o.weights)
                        : std::string("as stored (") + dtype_name(m.weights().lm_head.dtype) + ")";
  if (o.prompt_tokens + o.gen_tokens > m.config().max_position_embeddings)
    return make_error("bench: prompt + gen tokens exceed max_position_embeddings = " +
                      std::to_string(m.config().max_position_embeddings));

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(m.config().vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
  for (auto& t : prompt) t = tok(rng);

  {  // Untimed warm-up: the first pass over a memory-mapped model pays its page faults (a cold
     // run 1 prefilled at ~1/10 of the warm rate). 64 tokens route to nearly every expert.
    auto warm = m.open_session();
    if (!warm) return make_error(warm.error());
    auto l = (*warm)->append(
        std::span<const int32_t>(prompt.data(), size_t(std::min<int64_t>(64, o.prompt_tokens))));
    if (!l) return make_error(l.error());
  }
  std::vector<double> prefill, decode;
  for (int run = 0; run < o.runs; ++run) {
    auto session = m.open_session();
    if (!session) return make_error(session.error());
    Session& s = **session;
    double a = now_s();
    auto logits = s.append(prompt);
    if (!logits) return make_error(logits.error());
    prefill.push_back(double(o.prompt_tokens) / (now_s() - a));
    a = now_s();
    for (int64_t i = 0; i < o.gen_tokens; ++i) {
      const int32_t next = argmax(s.last_logits());
      auto step = s.append(std::span<const int32_t>(&next, 1));
      if (!step) return make_error(step.error());
    }
    decode.push_back(double(o.gen_tokens) / (now_s() - a));
  }
  if (o.draft_tokens > 0) {
    auto v = verify_costs(m, prompt, o.draft_tokens, o.runs);
    if (!v) return make_error(v.error());
    r.verify = std::move(*v);
  }
  r.prefill_tok_s = median(prefill);
  r.decode_tok_s = median(decode);
  r.decode_runs_tok_s = decode;
  r.weight_bytes_per_token = weight_bytes_per_token(m.weights(), m.config().num_experts_per_tok);
  r.state_bytes_per_token = decode_state_bytes(m, o.prompt_tokens + o.gen_tokens / 2);
  r.bytes_per_token = r.weight_bytes_per_token + r.state_bytes_per_token;
  r.achieved_gb_s = double(r.bytes_per_token) * r.decode_tok_s / 1e9;
  r.measured_gb_s = cpu::measure_read_bandwidth(r.threads, o.bandwidth_buffer_bytes).gb_per_s;
  r.bandwidth_fraction = r.measured_gb_s > 0 ? r.achieved_gb_s / r.measured_gb_s : 0;
  return r;
}

std::string SpeedBenchReport::to_json() const {
  nlohmann::json j{{"weights", weights},
                   {"cache_dtype", cache_dtype},
                   {"threads", threads},
                   {"prompt_tokens", prompt_tokens},
                   {"gen_tokens", gen_tokens},
                   {"load_s", load_s},
                   {"prefill_tok_s", prefill_tok_s},
                   {"decode_tok_s", decode_tok_s},
                   {"decode_runs_tok_s", decode_runs_tok_s},
                   {"weight_bytes_per_token", weight_bytes_per_token},
                   {"state_bytes_per_token", state_bytes_per_token},
                   {"bytes_per_token", bytes_per_token},
                   {"achieved_gb_s", achieved_gb_s},
                   {"measured_gb_s", measured_gb_s},
                   {"bandwidth_fraction", bandwidth_fraction}};
  if (!verify.empty()) {
    j["verify"] = nlohmann::json::array();
    for (const VerifyCost& c : verify)
      j["verify"].push_back({{"draft_tokens", c.draft_tokens},
                             {"step_ms", c.step_ms},
                             {"vs_decode", c.vs_decode},
                             {"experts_per_layer", c.experts_per_layer}});
  }
  return j.dump();
}

std::string SpeedBenchReport::to_table() const {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "| weights | cache | threads | prefill tok/s (%lld) | decode tok/s (%lld) | MB/token (weights+state) | "
      "achieved GB/s | measured GB/s | of bandwidth |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
      "| %s | %s | %d | %.1f | %.1f | %.1f (%.1f+%.1f) | %.1f | %.1f | %.0f%% |\n",
      static_cast<long long>(prompt_tokens), static_cast<long long>(gen_tokens), weights.c_str(),
      cache_dtype.c_str(), threads, prefill_tok_s, decode_tok_s, bytes_per_token / 1e6,
      weight_bytes_per_token / 1e6, state_bytes_per_token / 1e6, achieved_gb_s, measured_gb_s,
      100 * bandwidth_fraction);
  std::string out = buf;
  if (verify.empty()) return out;
  // A step that forwards 1 + k tokens yields 1 + (accepted drafts) tokens: it pays off when more
  // than vs_decode − 1 drafts are accepted per step on average.
  out += "\nSpeculative verification at the end of the prompt (a token + k draft tokens per step):\n\n"
         "| draft tokens | step ms | × decode step | experts/layer | break-even accepted per step |\n"
         "|---:|---:|---:|---:|---:|\n";
  for (const VerifyCost& c : verify) {
    std::snprintf(buf, sizeof buf, "| %d | %.2f | %.2f | %.1f | %.2f |\n", c.draft_tokens, c.step_ms, c.vs_decode,
                  c.experts_per_layer, c.vs_decode - 1);
    out += buf;
  }
  return out;
}

}  // namespace kiln::engine
