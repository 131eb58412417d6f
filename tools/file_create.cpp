// `create`: a new file with the given text; refuses to overwrite.
#include <sys/stat.h>

#include "tools/common.h"

namespace kiln::tools {

namespace {

ToolResult create(const nlohmann::json& args, Context& ctx) {
  std::string path = args["path"];
  const std::string& text = args["file_text"].get_ref<const std::string&>();
  auto resolved = resolve_in_workspace(ctx.workspace, path, Access::write);
  if (!resolved.ok()) return fail(resolved.error);
  const auto& [host, shown] = resolved.value;
  struct stat st {};
  if (lstat(host.c_str(), &st) == 0) {
    return fail(shown + " already exists; use str_replace or insert to change it");
  }
  auto written = write_bytes(ctx.workspace, host, text);
  if (!written.ok()) return fail(written.error);
  return {"Created " + shown + " (" + std::to_string(text.size()) + " bytes, " + std::to_string(line_count(text)) + " lines).",
          {{"path", shown}, {"bytes", text.size()}}};
}

}  // namespace

Tool create_tool() {
  return {"create",
          "Create a new file with the given text (fails if the file exists); missing parent directories are created.",
          {{"type", "object"},
           {"properties",
            {{"path", {{"type", "string"}, {"description", "New file, relative to /workspace"}}},
             {"file_text", {{"type", "string"}, {"description", "The complete contents of the file"}}}}},
           {"required", {"path", "file_text"}}},
          create};
}

}  // namespace kiln::tools
