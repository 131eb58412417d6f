// engine_speed_bench: prefill and decode tokens/s of one model, bytes per decoded token and the
// fraction of the measured memory bandwidth decode achieves (the same figures as
// `kiln engine bench`). With --make-bench-shape it first writes issue 9's bench model
// (make-tiny MoE: hidden 1024, 16 layers, 64 experts top-8, vocab 32768, bf16) into --model.
//
//   build/bin/engine_speed_bench --model /tmp/bench-shape --make-bench-shape
//       [--weights q8|q4|bf16|stored] [--cache-dtype f32|bf16] [--threads N] [--prompt-tokens 512]
//       [--gen-tokens 128] [--runs 3] [--json]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/cpu/cpu_features.h"
#include "engine/make_tiny.h"
#include "engine/speed_bench.h"

using namespace kiln::engine;

int main(int argc, char** argv) {
  SpeedBenchOptions o;
  bool make = false, json = false;
  std::string cmdline;
  for (int i = 0; i < argc; ++i) {
    if (i) cmdline += ' ';
    cmdline += argv[i];  // appended in place: `" " + std::string(…)` tripped GCC 12's -Wrestrict
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "engine_speed_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") o.model_dir = value();
    else if (a == "--make-bench-shape") make = true;
    else if (a == "--json") json = true;
    else if (a == "--threads") o.threads = std::atoi(value().c_str());
    else if (a == "--prompt-tokens") o.prompt_tokens = std::atoll(value().c_str());
    else if (a == "--gen-tokens") o.gen_tokens = std::atoll(value().c_str());
    else if (a == "--runs") o.runs = std::atoi(value().c_str());
    else if (a == "--weights") {
      const std::string v = value();
      const auto choice = cpu::parse_weight_choice(v);
      if (!choice) {
        std::fprintf(stderr, "engine_speed_bench: --weights %s: expected %s\n", v.c_str(),
                     std::string(cpu::kWeightChoicesText).c_str());
        return 2;
      }
      o.weights = *choice;
    } else if (a == "--cache-dtype") {
      const std::string v = value();
      const auto dtype = parse_cache_dtype(v);
      if (!dtype) {
        std::fprintf(stderr, "engine_speed_bench: --cache-dtype %s: expected f32 or bf16\n", v.c_str());
        return 2;
      }
      o.cache_dtype = *dtype;
    } else {
      std::fprintf(stderr, "engine_speed_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.model_dir.empty()) {
    std::fprintf(stderr, "engine_speed_bench: --model DIR is required\n");
    return 2;
  }
  if (make && !std::filesystem::exists(std::filesystem::path(o.model_dir) / "config.json")) {
    TinyModelOptions t;
    t.layers = 16;
    t.full_attention_interval = 4;
    t.hidden = 1024;
    t.heads = 8, t.kv_heads = 2, t.head_dim = 256;
    t.linear_key_heads = 8, t.linear_value_heads = 16, t.linear_key_head_dim = 128, t.linear_value_head_dim = 128;
    t.experts = 64, t.top_k = 8, t.moe_intermediate = 512, t.shared_expert_intermediate = 512;
    t.vocab = 32768;
    t.max_position_embeddings = 32768;
    t.dtype = Dtype::bf16;
    std::fprintf(stderr, "engine_speed_bench: writing the bench-shape model to %s\n", o.model_dir.c_str());
    Status s = make_tiny_model(o.model_dir, t);
    if (!s) {
      std::fprintf(stderr, "engine_speed_bench: %s\n", s.error().c_str());
      return 1;
    }
  }
  o.progress = true;
  auto r = run_speed_bench(o);
  if (!r) {
    std::fprintf(stderr, "engine_speed_bench: %s\n", r.error().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", r->to_json().c_str());
  } else {
    std::printf("# %s\n# cpu: %s; load %.1f s\n\n%s", cmdline.c_str(), cpu::cpu_features_string().c_str(), r->load_s,
                r->to_table().c_str());
  }
  return 0;
}
