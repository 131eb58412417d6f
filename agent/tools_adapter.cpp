#include "agent/tools_adapter.h"

#include <algorithm>

namespace kiln::agent {

RegistryToolExecutor::RegistryToolExecutor(const tools::ToolRegistry& registry, tools::Context& context)
    : registry_(registry), context_(context), max_timeout_(context.max_command_timeout) {}

std::vector<ToolSchema> RegistryToolExecutor::schemas() const {
  std::vector<ToolSchema> out;
  for (const auto& tool : registry_.tools())
    out.push_back({tool.name, tool.description, Json::parse(tool.schema.dump())});
  return out;
}

ToolObservation RegistryToolExecutor::run(const ToolCall& call, double timeout_s, const std::atomic<bool>& stop) {
  context_.cancel = &stop;
  auto limit = max_timeout_;
  if (timeout_s > 0)
    limit = std::min(limit, std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(timeout_s * 1000))));
  context_.max_command_timeout = limit;
  tools::ToolResult r = registry_.call(call.name, nlohmann::json::parse(call.arguments.dump()), context_);
  context_.cancel = nullptr;
  ToolObservation obs;
  obs.text = std::move(r.text);
  obs.ok = !r.is_error;
  obs.submitted = r.finished;
  obs.data = Json::parse(r.data.dump());
  if (r.finished && r.data.contains("summary") && r.data["summary"].is_string()) obs.summary = r.data["summary"];
  obs.infra_error = r.data.is_object() && r.data.value("infra_error", false);
  return obs;
}

}  // namespace kiln::agent
