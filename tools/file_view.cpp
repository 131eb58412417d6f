// `view`: a file with line numbers (cat -n style), or a directory two levels deep.
#include <algorithm>

#include "tools/common.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxLines = 400;
constexpr std::size_t kMaxChars = 20'000;
constexpr std::size_t kMaxEntries = 400;

void list_dir(const fs::path& dir, const std::string& prefix, int depth, std::vector<std::string>& out) {
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind('.', 0) == 0) continue;  // hidden
    entries.push_back(*it);
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries) {
    if (out.size() >= kMaxEntries) return;
    bool is_dir = e.is_directory(ec) && !e.is_symlink(ec);
    std::string name = prefix + e.path().filename().string() + (is_dir ? "/" : "");
    out.push_back(name);
    if (is_dir && depth < 2) list_dir(e.path(), name, depth + 1, out);
  }
}

ToolResult view(const nlohmann::json& args, Context& ctx) {
  std::string path = args["path"];
  auto resolved = resolve_in_workspace(ctx.workspace, path, Access::read);
  if (!resolved.ok()) return fail(resolved.error);
  const auto& [host, shown] = resolved.value;
  std::error_code ec;
  if (fs::is_directory(host, ec)) {
    std::vector<std::string> entries;
    list_dir(host, "", 1, entries);
    std::string text = "Entries of " + shown + " (two levels, hidden ones skipped):\n";
    for (const auto& e : entries) text += e + "\n";
    if (entries.size() >= kMaxEntries) text += "[listing stopped at " + std::to_string(kMaxEntries) + " entries; view a subdirectory to see more]\n";
    return {text, {{"path", shown}, {"kind", "directory"}, {"entries", entries.size()}}};
  }
  auto bytes = read_bytes(host);
  if (!bytes.ok()) return fail(bytes.error);
  const std::string& text = bytes.value;
  if (looks_binary(text)) return fail(shown + " is a binary file (" + std::to_string(text.size()) + " bytes); not shown");
  std::size_t total = line_count(text);
  std::size_t first = 1, last = total;
  if (args.contains("view_range")) {
    const auto& range = args["view_range"];
    if (range.size() != 2) return fail("view_range must be [start, end]");
    long long a = range[0], b = range[1];
    if (a < 1 || (b != -1 && b < a)) return fail("view_range [" + std::to_string(a) + ", " + std::to_string(b) + "] is invalid: start >= 1, end >= start or -1 for the end of the file");
    if (total > 0 && static_cast<std::size_t>(a) > total) return fail("view_range starts at line " + std::to_string(a) + " but " + shown + " has " + std::to_string(total) + " lines");
    first = static_cast<std::size_t>(a);
    last = b == -1 ? total : std::min(total, static_cast<std::size_t>(b));
  }
  bool cut = false;
  if (last - first + 1 > kMaxLines && total > 0) {
    last = first + kMaxLines - 1;
    cut = true;
  }
  std::string body = numbered(text, first, last);
  if (body.size() > kMaxChars) {  // very long lines: cut at a line boundary
    std::size_t keep = body.rfind('\n', kMaxChars);
    if (keep == std::string::npos) {
      // The first line alone is over the limit (minified code, data on one line): show its start,
      // say how much is left and how to read it; the next range then starts after it.
      const std::size_t line_end = std::min(body.find('\n'), body.size());
      body.resize(kMaxChars);
      body += "\n[... line " + std::to_string(first) + " goes on for " + std::to_string(line_end - kMaxChars) +
              " more characters; read the rest with bash, e.g. sed -n " + std::to_string(first) + "p " + shown +
              " | cut -c" + std::to_string(kMaxChars + 1) + "-" + std::to_string(2 * kMaxChars) + "]\n";
      last = first;
    } else {
      body.resize(keep + 1);
      last = first + static_cast<std::size_t>(std::count(body.begin(), body.end(), '\n')) - 1;
    }
    cut = true;
  }
  std::string out = valid_utf8(body);
  if (total == 0) out = "[" + shown + " is empty]\n";
  if (cut) {
    out += "[shown lines " + std::to_string(first) + "-" + std::to_string(last) + " of " + std::to_string(total);
    if (last < total)
      out += "; use view_range [" + std::to_string(last + 1) + ", " + std::to_string(std::min(total, last + kMaxLines)) + "] to see more";
    out += "]\n";
  }
  return {out, {{"path", shown}, {"kind", "file"}, {"lines", total}, {"first", first}, {"last", last}, {"truncated", cut}}};
}

}  // namespace

Tool view_tool() {
  return {"view",
          "Show a file with line numbers (optionally only lines [start, end]; end -1 means to the end), "
          "or list a directory two levels deep. Paths are relative to /workspace.",
          {{"type", "object"},
           {"properties",
            {{"path", {{"type", "string"}, {"description", "File or directory, relative to /workspace"}}},
             {"view_range", {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 2}, {"maxItems", 2},
                             {"description", "[start, end] line numbers, 1-based, inclusive; end -1 = last line"}}}}},
           {"required", {"path"}}},
          view};
}

}  // namespace kiln::tools
