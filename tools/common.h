// What every tool file includes: the public API, path/file helpers, line helpers, and fail().
// Internal to tools/.
#pragma once

#include <string>

#include "tools/paths.h"
#include "tools/text.h"
#include "tools/tools.h"

namespace kiln::tools {

// An error observation for the model ("Error: ...") with the same message in the log record.
inline ToolResult fail(const std::string& message, nlohmann::json data = nlohmann::json::object()) {
  data["error"] = message;
  return ToolResult{"Error: " + message, std::move(data), true, false};
}

}  // namespace kiln::tools
