// `kiln engine <verb>`: the engine's own tools (info, plan, logits, generate, make-tiny, bench).
// Each verb parses into a small options struct (kept alive by the callback) and calls the engine
// library; errors go to ctx.err with exit code 1 (usage errors: 2).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/batch_bench.h"
#include "engine/engine.h"
#include "engine/make_tiny.h"
#include "engine/speed_bench.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/cli/commands.h"

namespace kiln::cli {
namespace {

using namespace kiln::engine;

// Comma-separated non-negative int32s; `bad` names the first item that is not one. A value out of
// range is refused, not wrapped (4294967297 would become token 1).
bool parse_ids(const std::string& text, std::vector<int32_t>& out, std::string& bad) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      out.push_back(int32_t(v));
    } catch (...) {
      bad = item;
      return false;
    }
  }
  return true;
}

std::string layout_string(const ModelConfig& c) {
  std::string s;
  for (LayerType t : c.layer_types) s += t == LayerType::full_attention ? 'F' : 'L';
  return s;
}

int fail(Context& ctx, const std::string& what, const std::string& msg) {
  ctx.err << "kiln engine " << what << ": " << msg << "\n";
  return ctx.exit_code = 1;
}

struct ModelArgs {
  std::string model;
  int threads = 0;
  std::string cache_dtype = "f32";
  std::string weights = "stored";  // each verb sets its default before add_model_args
};

// --weights: stored (the checkpoint's dtype, exact) or bf16/q8/q4 converted at load and cached
// next to the model (engine/weights/quantized_weights.h). q8 is the default for serving-like verbs
// (generate, bench); logits and info stay exact unless told otherwise.
std::optional<cpu::WeightFormat> weights_choice(const std::string& w) {
  return cpu::parse_weight_choice(w).value_or(std::nullopt);  // checked by the option already
}

CacheDtype cache_dtype_choice(const std::string& d) {
  return parse_cache_dtype(d).value_or(CacheDtype::f32);  // checked by the option already
}

void add_model_args(CLI::App* sub, ModelArgs& a) {
  sub->add_option("--model", a.model, "Model directory (config.json + safetensors)")->required();
  sub->add_option("--threads", a.threads, "Worker threads (0: all cores)");
  sub->add_option("--cache-dtype", a.cache_dtype, "KV/conv cache dtype: f32 (exact) or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--weights", a.weights, "Weight storage: stored (exact), bf16, q8 or q4")
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(cpu::kWeightChoices), std::end(cpu::kWeightChoices))));
}

Result<std::unique_ptr<Model>> load(const ModelArgs& a, int max_sessions = 2) {
  EngineOptions o;
  o.threads = a.threads;
  o.max_sessions = max_sessions;
  o.cache_dtype = cache_dtype_choice(a.cache_dtype);
  o.kv_budget_bytes = int64_t(4) << 30;
  o.weights = weights_choice(a.weights);
  o.progress = true;  // quantizing a large model takes a while: show it on stderr
  return Model::load(a.model, o);
}

void add_info(CLI::App& engine, Context& ctx) {
  auto a = std::make_shared<ModelArgs>();
  CLI::App* sub = engine.add_subcommand("info", "Describe a model directory");
  add_model_args(sub, *a);
  sub->callback([&ctx, a] {
    auto m = load(*a);
    if (!m) return void(fail(ctx, "info", m.error()));
    const ModelConfig& c = (*m)->config();
    const ModelWeights& w = (*m)->weights();
    ctx.out << "model: " << a->model << "\narchitecture: " << c.model_type << (c.is_moe ? " (MoE)" : " (dense)")
            << "\nlayers: " << c.num_hidden_layers << " (" << c.n_linear_layers() << " Gated DeltaNet + "
            << c.n_full_layers() << " full attention): " << layout_string(c) << "\nhidden: " << c.hidden_size
            << ", vocab: " << c.vocab_size << ", max positions: " << c.max_position_embeddings
            << "\nattention: " << c.num_attention_heads << " q / " << c.num_key_value_heads << " kv heads of "
            << c.head_dim << ", rotary dims " << c.rotary_dim << ", theta " << c.rope_theta
            << "\ndelta net: " << c.linear_num_key_heads << " key heads of " << c.linear_key_head_dim << ", "
            << c.linear_num_value_heads << " value heads of " << c.linear_value_head_dim << ", conv "
            << c.linear_conv_kernel_dim << "\n";
    if (c.is_moe) {
      const MoeWeights& moe = w.layers[0].moe;  // sizes as bound (a config may omit them)
      ctx.out << "ffn: MoE, " << c.num_experts << " experts, top " << c.num_experts_per_tok << ", intermediate "
              << moe.experts[0].down_proj.cols << ", shared expert "
              << (moe.has_shared_expert ? moe.shared_expert.down_proj.cols : 0) << "\n";
    }
    else
      ctx.out << "ffn: dense SwiGLU, intermediate " << c.intermediate_size << "\n";
    ctx.out << "parameters: " << w.n_params << " (" << w.n_bytes << " bytes as stored)\n"
            << "active per token: " << w.n_params_active << " parameters, " << w.n_bytes_active << " bytes\n"
            << "weights stored as (--weights " << a->weights << "; generate, bench and serving default to q8):\n";
    for (const WeightFamilyStorage& f : describe_weight_storage(w))
      ctx.out << "  " << f.family << ": " << f.storage << ", " << f.tensors << " tensors, " << f.bytes << " bytes\n";
    if (const StoredWeights* sw = (*m)->stored_weights())
      ctx.out << "converted weights: " << sw->bytes() << " bytes"
              << (sw->cache_path().empty() ? std::string(", not cached")
                                           : (sw->from_cache() ? ", mapped from " : ", cached to ") + sw->cache_path())
              << "\n";
    ctx.out << "weight bytes read per decoded token: " << weight_bytes_per_token(w, c.num_experts_per_tok) << "\n";
    for (const auto& warn : w.warnings) ctx.out << "warning: " << warn << "\n";
    if (const StoredWeights* sw = (*m)->stored_weights())
      for (const auto& warn : sw->warnings()) ctx.out << "warning: " << warn << "\n";
  });
}

void add_plan(CLI::App& engine, Context& ctx) {
  struct Args {
    std::string model, config, budget = "36GiB", dtype = "both";
    int sessions = 16;
    int64_t page_tokens = 16;
    int draft_tokens = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = engine.add_subcommand("plan", "Plan KV capacity for a memory budget");
  auto* mo = sub->add_option("--model", a->model, "Model directory");
  sub->add_option("--config", a->config, "A config.json file")->excludes(mo);
  sub->add_option("--kv-budget", a->budget, "Bytes for KV and session state, e.g. 36GiB");
  sub->add_option("--max-sessions", a->sessions, "Concurrent sessions");
  sub->add_option("--kv-dtype", a->dtype, "bf16, f32 or both")->check(CLI::IsMember({"bf16", "f32", "both"}));
  sub->add_option("--page-tokens", a->page_tokens, "Tokens per KV page");
  sub->add_option("--draft-tokens", a->draft_tokens,
                  "Longest speculative draft (the server's draft_tokens): its per-session scratch is planned too")
      ->check(CLI::Range(0, 16));
  sub->callback([&ctx, a] {
    if (a->model.empty() == a->config.empty()) {
      ctx.err << "kiln engine plan: give --model DIR or --config FILE\n";
      return void(ctx.exit_code = 2);
    }
    auto c = load_model_config(a->config.empty() ? a->model + "/config.json" : a->config);
    if (!c) return void(fail(ctx, "plan", c.error()));
    const int64_t budget = parse_bytes(a->budget);
    if (budget <= 0) return void(fail(ctx, "plan", "--kv-budget '" + a->budget + "' is not a byte size"));
    if (a->sessions < 1 || a->page_tokens < 1) return void(fail(ctx, "plan", "--max-sessions and --page-tokens must be >= 1"));
    ctx.out << "model: " << c->model_type << ", " << c->n_full_layers() << " full-attention + " << c->n_linear_layers()
            << " Gated DeltaNet layers\n";
    for (CacheDtype d : {CacheDtype::bf16, CacheDtype::f32}) {
      if (a->dtype != "both" && a->dtype != cache_dtype_name(d)) continue;
      ctx.out << "\n" << plan_capacity(*c, budget, a->sessions, d, a->page_tokens, a->draft_tokens).to_text();
    }
  });
}

void print_logits_json(std::ostream& out, const std::vector<float>& all, int64_t V) {
  out << "{\"logits\": [";
  char buf[32];
  for (size_t t = 0; t * size_t(V) < all.size(); ++t) {
    out << (t ? ", [" : "[");
    for (int64_t i = 0; i < V; ++i) {
      std::snprintf(buf, sizeof buf, "%.9g", double(all[t * size_t(V) + size_t(i)]));
      out << (i ? ", " : "") << buf;
    }
    out << "]";
  }
  out << "]}\n";
}

void add_logits(CLI::App& engine, Context& ctx) {
  struct Args : ModelArgs {
    std::string tokens, mode = "prefill";
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = engine.add_subcommand("logits", "Print the logits of a token sequence as JSON");
  add_model_args(sub, *a);
  sub->add_option("--tokens", a->tokens, "Comma-separated token ids")->required();
  sub->add_option("--mode", a->mode, "prefill, decode, or split:N (prefill N, then decode)");
  sub->callback([&ctx, a] {
    std::vector<int32_t> ids;
    std::string bad;
    if (!parse_ids(a->tokens, ids, bad) || ids.empty())
      return void(fail(ctx, "logits", "--tokens: '" + bad + "' is not a token id"));
    int64_t split = -1;
    if (a->mode == "prefill") split = int64_t(ids.size());
    else if (a->mode == "decode") split = 0;
    else if (a->mode.rfind("split:", 0) == 0) {
      try {
        split = std::stol(a->mode.substr(6));
      } catch (...) {
      }
    }
    if (split < 0 || split > int64_t(ids.size()))
      return void(fail(ctx, "logits", "--mode '" + a->mode + "' must be prefill, decode or split:N with N <= tokens"));
    auto m = load(*a);
    if (!m) return void(fail(ctx, "logits", m.error()));
    auto s = (*m)->open_session();
    if (!s) return void(fail(ctx, "logits", s.error()));
    std::vector<float> all;
    if (split > 0) {
      auto l = (*s)->append(std::span<const int32_t>(ids.data(), size_t(split)), true);
      if (!l) return void(fail(ctx, "logits", l.error()));
      all = std::move(l).value();
    }
    for (size_t i = size_t(split); i < ids.size(); ++i) {
      auto l = (*s)->append(std::span<const int32_t>(&ids[i], 1));
      if (!l) return void(fail(ctx, "logits", l.error()));
      all.insert(all.end(), l->begin(), l->end());
    }
    print_logits_json(ctx.out, all, (*m)->config().vocab_size);
  });
}

void add_sampling_args(CLI::App* sub, GenerateOptions& g) {
  // CLI::Range alone lets NaN through (every comparison with NaN is false): "nan" as a temperature
  // sampled the least likely token.
  const CLI::Validator finite([](std::string& v) {
    const double x = std::strtod(v.c_str(), nullptr);
    return std::isfinite(x) ? std::string() : "must be a finite number, got " + v;
  }, "FINITE");
  sub->add_option("--max-tokens", g.max_tokens, "Token budget")->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", g.sampling.temperature, "0: greedy")->check(finite & CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", g.sampling.top_k, "0: off")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", g.sampling.top_p, "1: off")->check(finite & CLI::Range(0.0, 1.0));
  sub->add_option("--min-p", g.sampling.min_p, "0: off")->check(finite & CLI::Range(0.0, 1.0));
  sub->add_option("--presence-penalty", g.sampling.presence_penalty, "Subtracted from generated tokens' logits")
      ->check(finite);
  sub->add_option("--seed", g.sampling.seed, "Sampling seed");
  sub->add_option("--draft-tokens", g.speculative.draft_tokens,
                  "Prompt-lookup speculative decoding: most draft tokens verified per step (0: off; same output)")
      ->check(CLI::Range(0, 16));
}

void add_generate(CLI::App& engine, Context& ctx) {
  struct Args : ModelArgs {
    std::string tokens, prompt, stop;
    GenerateOptions gen;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = engine.add_subcommand("generate", "Generate tokens from a prompt, streaming them");
  a->weights = "q8";
  add_model_args(sub, *a);
  auto* t = sub->add_option("--tokens", a->tokens, "Comma-separated prompt token ids");
  sub->add_option("--prompt", a->prompt, "Prompt text (needs the model's tokenizer.json)")->excludes(t);
  sub->add_option("--stop", a->stop, "Comma-separated stop ids (default: the eos ids of config.json and generation_config.json)");
  add_sampling_args(sub, a->gen);
  sub->callback([&ctx, a] {
    std::vector<int32_t> ids;
    std::string bad;
    std::unique_ptr<Tokenizer> tokenizer;
    if (!a->prompt.empty()) {  // text in, text out
      TokenizerLoad t = Tokenizer::load_model_dir(a->model);
      if (!t.ok()) return void(fail(ctx, "generate", "--prompt needs the model's tokenizer: " + t.error));
      tokenizer = std::move(t.tokenizer);
      ids = tokenizer->encode(a->prompt);
    } else if (!parse_ids(a->tokens, ids, bad) || ids.empty()) {
      return void(fail(ctx, "generate", "--tokens: give comma-separated prompt ids ('" + bad +
                                            "' is not a token id: 0..2147483647)"));
    }
    auto m = load(*a);
    if (!m) return void(fail(ctx, "generate", m.error()));
    GenerateOptions g = a->gen;
    if (!a->stop.empty() && !parse_ids(a->stop, g.stop, bad))
      return void(fail(ctx, "generate", "--stop: '" + bad + "' is not a token id"));
    if (tokenizer) g.sampling.vocab_limit = int64_t(tokenizer->vocab_size());  // never sample padding rows
    if (a->stop.empty())
      for (int64_t e : (*m)->config().eos_token_ids) g.stop.push_back(int32_t(e));
    auto s = (*m)->open_session();
    if (!s) return void(fail(ctx, "generate", s.error()));
    auto p = (*s)->append(ids);
    if (!p) return void(fail(ctx, "generate", p.error()));
    const auto started = std::chrono::steady_clock::now();
    auto r = (*s)->generate(g, [&](int32_t tok) {
      // Stream as sampled: the token's bytes with --prompt, else one id per line.
      if (tokenizer) ctx.out << tokenizer->token_bytes(tok) << std::flush;
      else ctx.out << tok << "\n" << std::flush;
      return true;
    });
    if (tokenizer) ctx.out << "\n";
    if (!r) return void(fail(ctx, "generate", r.error()));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char rate[64];
    std::snprintf(rate, sizeof rate, " in %.2f s (%.1f tokens/s)", seconds, double(r->tokens.size()) / seconds);
    ctx.err << "generated " << r->tokens.size() << " tokens" << rate << ", stopped by "
            << (r->reason == GenerateResult::Reason::stop_token ? "a stop token" : "the token budget");
    if (r->draft_tokens > 0)
      ctx.err << "; " << r->steps << " steps, " << r->draft_accepted << " of " << r->draft_tokens
              << " draft tokens accepted";
    ctx.err << "\n";
  });
}

void add_make_tiny(CLI::App& engine, Context& ctx) {
  struct Args {
    std::string out, arch = "moe", dtype = "bf16";
    TinyModelOptions o;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = engine.add_subcommand("make-tiny", "Write a random-weight model directory in the released layout");
  TinyModelOptions& o = a->o;
  sub->add_option("--out", a->out, "Output directory")->required();
  sub->add_option("--arch", a->arch, "moe or dense")->check(CLI::IsMember({"moe", "dense"}));
  sub->add_option("--dtype", a->dtype, "bf16 or f32")->check(CLI::IsMember({"bf16", "f32"}));
  sub->add_option("--seed", o.seed, "Weight seed");
  sub->add_option("--layers", o.layers, "Layers");
  sub->add_option("--full-attention-interval", o.full_attention_interval, "Every Nth layer is full attention");
  sub->add_option("--hidden", o.hidden, "Hidden size");
  sub->add_option("--heads", o.heads, "Attention query heads");
  sub->add_option("--kv-heads", o.kv_heads, "Attention KV heads");
  sub->add_option("--head-dim", o.head_dim, "Attention head dim");
  sub->add_option("--linear-key-heads", o.linear_key_heads, "Gated DeltaNet key heads");
  sub->add_option("--linear-value-heads", o.linear_value_heads, "Gated DeltaNet value heads");
  sub->add_option("--linear-key-head-dim", o.linear_key_head_dim, "Gated DeltaNet key head dim");
  sub->add_option("--linear-value-head-dim", o.linear_value_head_dim, "Gated DeltaNet value head dim");
  sub->add_option("--experts", o.experts, "Experts (MoE)");
  sub->add_option("--top-k", o.top_k, "Experts per token (MoE)");
  sub->add_option("--moe-intermediate", o.moe_intermediate, "Expert intermediate size");
  sub->add_option("--shared-intermediate", o.shared_expert_intermediate, "Shared expert intermediate size (0: none)");
  sub->add_option("--intermediate", o.intermediate, "Dense MLP intermediate size");
  sub->add_option("--vocab", o.vocab, "Vocabulary size");
  sub->add_option("--shards", o.shards, "Safetensors shards (>1 writes an index)");
  sub->add_flag("--per-expert", o.per_expert, "Per-expert tensors instead of packed");
  sub->callback([&ctx, a] {
    TinyModelOptions o = a->o;
    o.moe = a->arch == "moe";
    o.dtype = a->dtype == "f32" ? Dtype::f32 : Dtype::bf16;
    Status s = make_tiny_model(a->out, o);
    if (!s) return void(fail(ctx, "make-tiny", s.error()));
    ctx.out << "wrote " << a->out << "\n";
  });
}

// Prefill and decode tokens/s, bytes per decoded token and achieved vs measured bandwidth
// (engine/speed_bench.h); --json prints the same figures as one object.
void add_bench(CLI::App& engine, Context& ctx) {
  struct Args : ModelArgs {
    int prompt_tokens = 512, gen_tokens = 128, runs = 3;
    bool json = false;
    std::string sessions;  // non-empty: the batching bench (engine/batch_bench.h)
    int64_t prefill_chunk = 512, fairness_prompt = 4096;
    int fairness_decoders = 4;
    int draft_tokens = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = engine.add_subcommand(
      "bench", "Measure prefill and decode speed against the memory bandwidth; with --sessions, batched decoding");
  a->weights = "q8";
  add_model_args(sub, *a);
  sub->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length");
  sub->add_option("--gen-tokens", a->gen_tokens, "Decoded tokens per run (per session with --sessions)");
  sub->add_option("--runs", a->runs, "Runs (the median is reported); with --sessions, decode rounds per concurrency");
  sub->add_option("--sessions", a->sessions,
                  "Concurrencies to measure batched decoding at, e.g. 1,2,4,8,16 (sessions on their own threads)");
  sub->add_option("--prefill-chunk", a->prefill_chunk, "With --sessions: prefill tokens per scheduler step");
  sub->add_option("--fairness-prompt", a->fairness_prompt,
                  "With --sessions: prefill admitted while --fairness-decoders sessions decode (0: skip)");
  sub->add_option("--fairness-decoders", a->fairness_decoders,
                  "Sessions decoding while the fairness prompt prefills (0: the prefill alone twice, a control)")
      ->check(CLI::Range(0, 64));
  sub->add_option("--draft-tokens", a->draft_tokens,
                  "Also time speculative verification steps of a token and 1..N draft tokens")
      ->check(CLI::Range(0, 16));
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->callback([&ctx, a] {
    auto common = [&](auto& o) {  // the options both benches share
      o.model_dir = a->model;
      o.weights = weights_choice(a->weights);
      o.threads = a->threads;
      o.cache_dtype = cache_dtype_choice(a->cache_dtype);
      o.prompt_tokens = a->prompt_tokens;
      o.gen_tokens = a->gen_tokens;
      o.progress = true;
    };
    if (!a->sessions.empty()) {
      BatchBenchOptions o;
      common(o);
      o.prefill_chunk = a->prefill_chunk;
      o.fairness_prompt_tokens = a->fairness_prompt;
      o.fairness_decoders = a->fairness_decoders;
      o.runs = a->runs;
      std::vector<int32_t> counts;
      std::string bad;
      if (!parse_ids(a->sessions, counts, bad)) return void(fail(ctx, "bench", "--sessions: `" + bad + "` is not a number"));
      o.sessions.assign(counts.begin(), counts.end());
      auto r = run_batch_bench(o);
      if (!r) return void(fail(ctx, "bench", r.error()));
      if (a->json) ctx.out << r->to_json() << "\n";
      else
        ctx.out << r->to_table(
            "kiln engine bench --model " + a->model + " --weights " + a->weights + " --cache-dtype " +
            a->cache_dtype + " --threads " + std::to_string(a->threads) + " --sessions " + a->sessions +
            " --prompt-tokens " + std::to_string(a->prompt_tokens) + " --gen-tokens " +
            std::to_string(a->gen_tokens) + " --runs " + std::to_string(a->runs) + " --prefill-chunk " +
            std::to_string(a->prefill_chunk) + " --fairness-prompt " + std::to_string(a->fairness_prompt) +
            " --fairness-decoders " + std::to_string(a->fairness_decoders));
      return;
    }
    SpeedBenchOptions o;
    common(o);
    o.runs = a->runs;
    o.draft_tokens = a->draft_tokens;
    auto r = run_speed_bench(o);
    if (!r) return void(fail(ctx, "bench", r.error()));
    if (a->json) ctx.out << r->to_json() << "\n";
    else ctx.out << r->to_table();
  });
}

}  // namespace

void add_engine_commands(CLI::App& engine, Context& ctx) {
  add_info(engine, ctx);
  add_plan(engine, ctx);
  add_logits(engine, ctx);
  add_generate(engine, ctx);
  add_make_tiny(engine, ctx);
  add_bench(engine, ctx);
}

}  // namespace kiln::cli
