#include "server/demo_model.h"

#include <filesystem>
#include <fstream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "engine/make_tiny.h"

namespace kiln::server {

namespace {

// The agent's system prompt and tool schemas alone take ~3.3k tokens, so the demo needs a context
// well past the tiny default of 4096 for a build to get going.
constexpr int64_t kDemoContext = 32768;

// The context length of an existing demo model (0 if unreadable): older kiln versions made 4096.
int64_t demo_context(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return 0;
  const nlohmann::json& text = doc.contains("text_config") ? doc["text_config"] : doc;
  return text.value("max_position_embeddings", int64_t{0});
}

}  // namespace

std::optional<std::string> add_demo_model(ServerConfig& config, std::ostream& log) {
  std::filesystem::path dir = std::filesystem::path(config.var_dir) / "models" / "demo";
  if (!std::filesystem::exists(dir / "config.json") || demo_context(dir) < kDemoContext) {
    engine::TinyModelOptions options;  // the engine's default tiny MoE hybrid, reproducible weights
    options.seed = 20260101;
    options.max_position_embeddings = kDemoContext;
    auto status = engine::make_tiny_model(dir.string(), options);
    if (!status.ok()) return "cannot create the demo model in " + dir.string() + ": " + status.error();
    log << "level=warn msg=\"created the demo model\" path=" << dir.string() << std::endl;
  }
  ModelConfig demo;
  demo.name = "demo";
  demo.path = dir.string();
  demo.max_sessions = 2;
  demo.kv_budget_bytes = 64ull << 20;
  demo.demo = true;
  config.models.push_back(demo);
  log << "level=warn msg=\"no models configured: serving the DEMO model, whose weights are RANDOM; builds run "
         "end to end but the model's output is noise. Configure real models with --config kiln.json\" model=demo path="
      << dir.string() << std::endl;
  return std::nullopt;
}

}  // namespace kiln::server
