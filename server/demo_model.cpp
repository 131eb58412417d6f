#include "server/demo_model.h"

#include <filesystem>
#include <ostream>

#include "engine/make_tiny.h"

namespace kiln::server {

std::optional<std::string> add_demo_model(ServerConfig& config, std::ostream& log) {
  std::filesystem::path dir = std::filesystem::path(config.var_dir) / "models" / "demo";
  if (!std::filesystem::exists(dir / "config.json")) {
    engine::TinyModelOptions options;  // the engine's default tiny MoE hybrid; seed 0: reproducible
    options.seed = 20260101;
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
