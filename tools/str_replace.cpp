// `str_replace`: replace exactly one occurrence of old_str with new_str, byte-exact elsewhere.
//
// Fidelity: the file is read and written as bytes; only [match, match + old_str.size()) changes.
// The model sees CRLF files without '\r' (view strips it), so when old_str has bare '\n' and does
// not match as given, it is tried with the file's CRLF endings — and new_str then gets them too.
#include "tools/common.h"

namespace kiln::tools {

namespace {

std::vector<std::size_t> find_all(const std::string& haystack, const std::string& needle) {
  std::vector<std::size_t> at;
  for (std::size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) {
    at.push_back(pos);
  }
  return at;
}

ToolResult str_replace(const nlohmann::json& args, Context& ctx) {
  std::string path = args["path"];
  std::string old_str = args["old_str"];
  std::string new_str = args.contains("new_str") ? args["new_str"].get<std::string>() : "";
  if (old_str.empty()) return fail("old_str is empty; give the exact text to replace (use insert to add text)");
  auto resolved = resolve_in_workspace(ctx.workspace, path, Access::write);
  if (!resolved.ok()) return fail(resolved.error);
  const auto& [host, shown] = resolved.value;
  auto bytes = read_bytes(host);
  if (!bytes.ok()) return fail(bytes.error);
  const std::string& text = bytes.value;

  auto matches = find_all(text, old_str);
  bool converted = false;
  if (matches.empty() && line_ending(text) == "\r\n" && old_str.find('\n') != std::string::npos &&
      old_str.find('\r') == std::string::npos) {
    old_str = with_line_ending(old_str, "\r\n");
    new_str = with_line_ending(new_str, "\r\n");
    matches = find_all(text, old_str);
    converted = true;
  }
  auto starts = line_starts(text);
  if (matches.empty()) {
    return fail("old_str was not found in " + shown + " (0 matches); it must match the file exactly, including whitespace",
                {{"path", shown}, {"matches", 0}});
  }
  if (matches.size() > 1) {
    std::string lines;
    for (std::size_t i = 0; i < matches.size() && i < 20; ++i) lines += (i ? ", " : "") + std::to_string(line_of(starts, matches[i]));
    return fail("old_str occurs " + std::to_string(matches.size()) + " times in " + shown + " (starting on lines " + lines +
                    "); include more surrounding text so it matches exactly once",
                {{"path", shown}, {"matches", matches.size()}});
  }
  std::size_t at = matches.front();
  std::string updated = text.substr(0, at) + new_str + text.substr(at + old_str.size());
  auto written = write_bytes(ctx.workspace, host, updated);
  if (!written.ok()) return fail(written.error);

  auto new_starts = line_starts(updated);
  std::size_t first = line_of(new_starts, at);
  std::size_t last = line_of(new_starts, new_str.empty() ? at : at + new_str.size() - 1);
  std::string out = "Edited " + shown + " (replaced 1 occurrence on line " + std::to_string(line_of(starts, at)) + "). Excerpt:\n" +
                    valid_utf8(edit_excerpt(updated, first, last));
  return {out, {{"path", shown}, {"line", line_of(starts, at)}, {"crlf_adapted", converted},
                {"removed_bytes", old_str.size()}, {"added_bytes", new_str.size()}}};
}

}  // namespace

Tool str_replace_tool() {
  return {"str_replace",
          "Replace exactly one occurrence of old_str with new_str in a file. old_str must match the file exactly "
          "(whitespace included) and occur once; include enough context to make it unique. The rest of the file is "
          "kept byte for byte.",
          {{"type", "object"},
           {"properties",
            {{"path", {{"type", "string"}, {"description", "File, relative to /workspace"}}},
             {"old_str", {{"type", "string"}, {"description", "Exact text to replace (non-empty, unique in the file)"}}},
             {"new_str", {{"type", "string"}, {"description", "Replacement text (may be empty to delete)"}}}}},
           {"required", {"path", "old_str", "new_str"}}},
          str_replace};
}

}  // namespace kiln::tools
