// `kiln engine tokenize|render`: the tokenizer and the chat template from the command line.
#include <CLI/CLI.hpp>

#include "server/cli/commands.h"

namespace kiln::cli {

void add_tokenizer_commands(CLI::App& engine, Context& ctx) {
  CLI::App* tokenize = engine.add_subcommand("tokenize", "Encode text to token ids (or decode ids)");
  tokenize->allow_extras();
  tokenize->callback([&ctx] { not_implemented(ctx, "engine tokenize"); });
  CLI::App* render = engine.add_subcommand("render", "Render a conversation with the chat template");
  render->allow_extras();
  render->callback([&ctx] { not_implemented(ctx, "engine render"); });
}

}  // namespace kiln::cli
