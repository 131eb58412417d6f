#include "test_support.h"

#include "engine/make_tiny.h"
#include "engine/tokenizer/tiny_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace kiln::agent::testing {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("kiln-agent-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

TestStore::TestStore(const std::filesystem::path& dir, bool fake_clock) {
  store::StoreOptions options;
  options.path = (dir / "kiln.db").string();
  if (fake_clock) options.now_ms = [c = clock] { return c->load(); };
  auto opened = store::Store::open(options);
  if (!opened.ok()) ADD_FAILURE() << "store: " << opened.error().message;
  else store = std::move(opened.value());
}

int shell(const std::string& command) {
  int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string capture(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string make_example_repo(const std::string& name, const std::filesystem::path& dest) {
  std::string script = std::string(KILN_SOURCE_DIR) + "/examples/make-repo.sh";
  std::string command = "sh '" + script + "' '" + name + "' '" + dest.string() + "' >/dev/null";
  if (shell(command) != 0) return "make-repo.sh failed for " + name;
  return "";
}

}  // namespace kiln::agent::testing

namespace kiln::agent::testing {

Workspace::Workspace(const std::string& example) {
  source = dir.path() / "source";
  workspace = dir.path() / "workspaces" / "ws";
  std::string made = make_example_repo(example, source);
  EXPECT_EQ(made, "");
  auto clone = tools::git_clone_workspace(source.string(), "", workspace, "1");
  EXPECT_TRUE(clone.ok()) << clone.error;
  context.workspace = workspace;
  context.policy.workspace = workspace;
  context.max_command_timeout = std::chrono::milliseconds(60'000);
  std::string prepared = sandbox::prepare_workspace(context.policy);
  EXPECT_EQ(prepared, "");
  executor = std::make_unique<RegistryToolExecutor>(registry, context);
}

constexpr int64_t kVocab = 1024;

TinyEngine::TinyEngine(int64_t max_positions, const std::string& chat_template) {
  engine::TinyModelOptions options;
  options.vocab = kVocab;
  options.max_position_embeddings = max_positions;
  options.tokenizer = false;
  auto made = engine::make_tiny_model(dir.path().string(), options);
  EXPECT_TRUE(made.ok()) << made.error();
  auto tok = engine::write_tiny_tokenizer(dir.path().string(), kVocab);
  EXPECT_TRUE(tok.ok()) << tok.error;
  if (!chat_template.empty()) {
    const auto config_path = dir.path() / "tokenizer_config.json";
    std::ifstream config_in(config_path), template_in(chat_template);
    EXPECT_TRUE(config_in.good() && template_in.good()) << chat_template;
    Json config = Json::parse(config_in, nullptr, false);
    std::stringstream text;
    text << template_in.rdbuf();
    config["chat_template"] = text.str();
    std::ofstream(config_path) << config.dump();
  }
  engine::EngineOptions engine_options;
  engine_options.threads = 2;
  engine_options.max_sessions = 2;
  engine_options.kv_budget_bytes = int64_t(64) << 20;
  auto loaded = engine::Model::load(dir.path().string(), engine_options);
  EXPECT_TRUE(loaded.ok()) << loaded.error();
  if (loaded.ok()) model = std::move(loaded.value());
  auto t = engine::Tokenizer::load_model_dir(dir.path().string());
  EXPECT_TRUE(t.ok()) << t.error;
  tokenizer = std::move(t.tokenizer);
}

ToolCall fix_median_call() {
  return call("str_replace", Json{{"path", "stats.py"},
                                  {"old_str", "    return ordered[middle]\n"},
                                  {"new_str",
                                   "    if len(ordered) % 2 == 0:\n"
                                   "        return (ordered[middle - 1] + ordered[middle]) / 2\n"
                                   "    return ordered[middle]\n"}});
}

}  // namespace kiln::agent::testing
