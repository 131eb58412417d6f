// `insert`: insert text after line N (0 = at the top), in the file's own line endings.
#include "tools/common.h"

namespace kiln::tools {

namespace {

ToolResult insert(const nlohmann::json& args, Context& ctx) {
  std::string path = args["path"];
  long long after = args["insert_line"];
  auto resolved = resolve_in_workspace(ctx.workspace, path, Access::write);
  if (!resolved.ok()) return fail(resolved.error);
  const auto& [host, shown] = resolved.value;
  auto bytes = read_bytes(host);
  if (!bytes.ok()) return fail(bytes.error);
  const std::string& text = bytes.value;
  std::size_t total = line_count(text);
  if (after < 0 || static_cast<std::size_t>(after) > total) {
    return fail("insert_line " + std::to_string(after) + " is out of range: " + shown + " has " + std::to_string(total) +
                " lines (0 inserts at the top)");
  }
  std::string eol = line_ending(text);
  std::string piece = with_line_ending(args["new_str"].get<std::string>(), eol);
  // Where line `after` ends (just past its line break), and whether that break exists.
  auto starts = line_starts(text);
  std::size_t at = after == 0 ? 0 : (static_cast<std::size_t>(after) < starts.size() ? starts[after] : text.size());
  bool at_end_without_newline = at == text.size() && !text.empty() && text.back() != '\n' && after > 0;
  std::string updated;
  if (at_end_without_newline) {
    // Keep the file's "no final newline": the break goes before the new text, not after it.
    if (piece.size() >= eol.size() && piece.compare(piece.size() - eol.size(), eol.size(), eol) == 0) piece.resize(piece.size() - eol.size());
    updated = text + eol + piece;
  } else {
    if (!piece.empty() && piece.back() != '\n') piece += eol;
    updated = text.substr(0, at) + piece + text.substr(at);
  }
  auto written = write_bytes(ctx.workspace, host, updated);
  if (!written.ok()) return fail(written.error);
  std::size_t inserted = line_count(piece) == 0 ? 0 : line_count(piece);
  std::size_t first = static_cast<std::size_t>(after) + 1;
  std::string out = "Inserted " + std::to_string(inserted) + " line(s) after line " + std::to_string(after) + " of " + shown +
                    ". Excerpt:\n" + valid_utf8(edit_excerpt(updated, first, inserted > 0 ? first + inserted - 1 : first));
  return {out, {{"path", shown}, {"after_line", after}, {"lines_inserted", inserted}}};
}

}  // namespace

Tool insert_tool() {
  return {"insert",
          "Insert text into a file after line insert_line (0 inserts at the top). Line endings follow the file's.",
          {{"type", "object"},
           {"properties",
            {{"path", {{"type", "string"}, {"description", "File, relative to /workspace"}}},
             {"insert_line", {{"type", "integer"}, {"description", "Insert after this line; 0 = top of the file"}}},
             {"new_str", {{"type", "string"}, {"description", "Text to insert"}}}}},
           {"required", {"path", "insert_line", "new_str"}}},
          insert};
}

}  // namespace kiln::tools
