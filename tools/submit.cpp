// `submit`: the model says it is done. This tool only records the summary; the agent loop ends
// the build when it sees ToolResult::finished.
#include "tools/common.h"

namespace kiln::tools {

Tool submit_tool() {
  return {"submit",
          "Declare the task finished, with a short summary of what you changed and how you checked it. "
          "Call it once, when the work is done.",
          {{"type", "object"},
           {"properties", {{"summary", {{"type", "string"}, {"description", "What was done, in a few sentences"}}}}},
           {"required", {"summary"}}},
          [](const nlohmann::json& args, Context&) {
            std::string summary = args["summary"];
            return ToolResult{"Submitted.", {{"summary", summary}}, false, true};
          }};
}

}  // namespace kiln::tools
