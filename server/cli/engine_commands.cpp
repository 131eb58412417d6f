// `kiln engine <verb>`: the engine's own tools (info, plan, logits, generate, make-tiny, bench).
#include <CLI/CLI.hpp>

#include "server/cli/commands.h"

namespace kiln::cli {

void add_engine_commands(CLI::App& engine, Context& ctx) {
  static const char* const verbs[][2] = {
      {"info", "Describe a model directory"},
      {"plan", "Plan KV capacity for a memory budget"},
      {"logits", "Print the logits of a token sequence as JSON"},
      {"generate", "Generate tokens from a prompt"},
      {"make-tiny", "Write a random-weight model directory in the released layout"},
      {"bench", "Measure prefill and decode speed"},
  };
  for (const auto& verb : verbs) {
    CLI::App* sub = engine.add_subcommand(verb[0], verb[1]);
    sub->allow_extras();
    const char* name = verb[0];
    sub->callback([&ctx, name] { not_implemented(ctx, (std::string("engine ") + name).c_str()); });
  }
}

}  // namespace kiln::cli
