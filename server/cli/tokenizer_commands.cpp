// `kiln engine tokenize|render`: the tokenizer and the chat template from the command line.
//   kiln engine tokenize --model DIR | --tokenizer FILE [--text S | --file F] [--decode IDS]
//   kiln engine render --model DIR --input conversation.json [--flavor 3.5|3.6] [--tokens]
#include <CLI/CLI.hpp>

#include <fstream>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/chat/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/cli/commands.h"

namespace kiln::cli {

namespace {

struct TokenizeArgs {
  std::string model_dir, tokenizer_file, text, file, decode;
  bool skip_special = false;
};

struct RenderArgs {
  std::string model_dir, input, flavor;
  bool tokens = false;
};

std::unique_ptr<engine::Tokenizer> load_tokenizer(Context& ctx, const std::string& model_dir,
                                                  const std::string& file) {
  engine::TokenizerLoad load = !file.empty() ? engine::Tokenizer::load_file(file)
                                             : engine::Tokenizer::load_model_dir(model_dir);
  if (!load.ok()) {
    ctx.err << "kiln engine: " << load.error << "\n";
    ctx.exit_code = 1;
  }
  return std::move(load.tokenizer);
}

// "1,2,3", "1 2 3" or "[1, 2, 3]" → ids.
bool parse_ids(const std::string& s, std::vector<engine::TokenId>& ids, std::string& error) {
  std::string cleaned;
  for (char c : s) cleaned += (c == ',' || c == '[' || c == ']') ? ' ' : c;
  std::istringstream in(cleaned);
  std::string word;
  while (in >> word) {
    try {
      std::size_t used = 0;
      const long long v = std::stoll(word, &used);
      if (used != word.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(word);
      ids.push_back(static_cast<engine::TokenId>(v));
    } catch (const std::exception&) {
      error = "--decode: '" + word + "' is not a token id";
      return false;
    }
  }
  return true;
}

void run_tokenize(Context& ctx, const TokenizeArgs& a) {
  if (a.model_dir.empty() == a.tokenizer_file.empty()) {
    ctx.err << "kiln engine tokenize: give exactly one of --model DIR or --tokenizer FILE\n";
    ctx.exit_code = 2;
    return;
  }
  const int sources = !a.text.empty() + !a.file.empty() + !a.decode.empty();
  if (sources != 1) {
    ctx.err << "kiln engine tokenize: give exactly one of --text, --file or --decode\n";
    ctx.exit_code = 2;
    return;
  }
  auto tok = load_tokenizer(ctx, a.model_dir, a.tokenizer_file);
  if (!tok) return;
  if (!a.decode.empty()) {
    std::vector<engine::TokenId> ids;
    std::string error;
    if (!parse_ids(a.decode, ids, error)) {
      ctx.err << "kiln engine tokenize: " << error << "\n";
      ctx.exit_code = 2;
      return;
    }
    ctx.out << tok->decode(ids, a.skip_special);
    return;
  }
  std::string text = a.text;
  if (!a.file.empty()) {
    std::string error;
    if (!engine::read_text_file(a.file, text, error)) {
      ctx.err << "kiln engine tokenize: " << error << "\n";
      ctx.exit_code = 1;
      return;
    }
  }
  ctx.out << nlohmann::json(tok->encode(text)).dump() << "\n";
}

void run_render(Context& ctx, const RenderArgs& a) {
  std::string text, error;
  if (!engine::read_text_file(a.input, text, error)) {
    ctx.err << "kiln engine render: " << error << "\n";
    ctx.exit_code = 1;
    return;
  }
  const engine::Json input = engine::Json::parse(text, nullptr, false);
  if (input.is_discarded()) {
    ctx.err << "kiln engine render: " << a.input << ": not valid JSON\n";
    ctx.exit_code = 1;
    return;
  }
  engine::RenderOptions defaults;
  std::unique_ptr<engine::Tokenizer> tok;
  if (!a.model_dir.empty()) {
    tok = load_tokenizer(ctx, a.model_dir, "");
    if (!tok) return;
    defaults.flavor = engine::detect_flavor(tok->chat_template());
  }
  if (a.flavor == "3.5") defaults.flavor = engine::TemplateFlavor::qwen3_5;
  if (a.flavor == "3.6") defaults.flavor = engine::TemplateFlavor::qwen3_6;
  engine::ParsedRenderInput parsed = engine::parse_render_input(input, defaults);
  if (!parsed.ok()) {
    ctx.err << "kiln engine render: " << a.input << ": " << parsed.error << "\n";
    ctx.exit_code = 1;
    return;
  }
  engine::RenderResult r = engine::render_chat(parsed.conversation, parsed.options);
  if (!r.ok()) {
    ctx.err << "kiln engine render: " << r.error << "\n";
    ctx.exit_code = 1;
    return;
  }
  if (a.tokens && tok) {
    std::vector<engine::TokenId> ids;  // the messages' text never becomes an added token
    tok->encode_append(r.text, ids, r.literal_spans);
    ctx.out << nlohmann::json(ids).dump() << "\n";
  }
  else ctx.out << r.text;
}

}  // namespace

void add_tokenizer_commands(CLI::App& engine, Context& ctx) {
  auto targs = std::make_shared<TokenizeArgs>();
  CLI::App* tokenize = engine.add_subcommand("tokenize", "Encode text to token ids (or decode ids)");
  tokenize->add_option("--model", targs->model_dir, "Model directory with tokenizer.json");
  tokenize->add_option("--tokenizer", targs->tokenizer_file, "A tokenizer.json (or .json.gz) file");
  tokenize->add_option("--text", targs->text, "Text to encode");
  tokenize->add_option("--file", targs->file, "File whose contents to encode");
  tokenize->add_option("--decode", targs->decode, "Token ids to decode, e.g. 1,2,3");
  tokenize->add_flag("--skip-special", targs->skip_special, "Leave out special tokens when decoding");
  tokenize->callback([&ctx, targs] { run_tokenize(ctx, *targs); });

  auto rargs = std::make_shared<RenderArgs>();
  CLI::App* render = engine.add_subcommand("render", "Render a conversation with the chat template");
  render->add_option("--model", rargs->model_dir, "Model directory (its template picks the flavour)");
  render->add_option("--input", rargs->input, "conversation.json: {messages, tools, options}")->required();
  render->add_option("--flavor", rargs->flavor, "Template flavour override")->check(CLI::IsMember({"3.5", "3.6"}));
  render->add_flag("--tokens", rargs->tokens, "Print the token ids instead of the text (needs --model)");
  render->callback([&ctx, rargs] { run_render(ctx, *rargs); });
}

}  // namespace kiln::cli
