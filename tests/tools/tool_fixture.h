// A workspace and a tools Context for tool tests.
#pragma once

#include "../sandbox/temp_workspace.h"
#include "tools/tools.h"

namespace kiln::testing {

struct ToolFixture {
  TempWorkspace ws;
  tools::ToolRegistry registry = tools::default_registry();
  tools::Context ctx;

  ToolFixture() {
    ctx.workspace = ws.path();
    ctx.policy = ws.policy();
    ctx.max_command_timeout = std::chrono::seconds(5);
    ctx.build_id = "test";
    std::string e = sandbox::prepare_workspace(ctx.policy);
    if (!e.empty()) throw std::runtime_error(e);
  }
  tools::ToolResult call(const std::string& name, const nlohmann::json& args) { return registry.call(name, args, ctx); }
};

}  // namespace kiln::testing
