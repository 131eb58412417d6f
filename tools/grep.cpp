// `grep`: search the workspace for a regex (PCRE2), optionally only in files matching a glob.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <fnmatch.h>
#include <pcre2.h>

#include <algorithm>
#include <memory>

#include "tools/common.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxMatches = 200;
constexpr std::size_t kMaxLineChars = 300;
constexpr std::size_t kMaxFileBytes = 4u << 20;

struct CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct DataFree {
  void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); }
};

bool glob_matches(const std::string& glob, const std::string& relative) {
  if (glob.empty()) return true;
  std::string base = fs::path(relative).filename().string();
  return fnmatch(glob.c_str(), relative.c_str(), FNM_PATHNAME) == 0 || fnmatch(glob.c_str(), base.c_str(), 0) == 0 ||
         fnmatch(glob.c_str(), relative.c_str(), 0) == 0;
}

ToolResult grep(const nlohmann::json& args, Context& ctx) {
  std::string pattern = args["pattern"];
  std::string where = args.contains("path") ? args["path"].get<std::string>() : ".";
  std::string glob = args.contains("glob") ? args["glob"].get<std::string>() : "";
  bool ignore_case = args.contains("ignore_case") && args["ignore_case"].get<bool>();
  auto resolved = resolve_in_workspace(ctx.workspace, where, Access::read);
  if (!resolved.ok()) return fail(resolved.error);

  int err = 0;
  PCRE2_SIZE offset = 0;
  uint32_t flags = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (ignore_case ? PCRE2_CASELESS : 0);
  std::unique_ptr<pcre2_code, CodeFree> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err, &offset, nullptr));
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(err, message, sizeof message);
    return fail("pattern is not a valid regex at offset " + std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
  }
  std::unique_ptr<pcre2_match_data, DataFree> data(pcre2_match_data_create_from_pattern(code.get(), nullptr));

  fs::path root = fs::canonical(ctx.workspace);
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_regular_file(resolved.value.host, ec)) {
    files.push_back(resolved.value.host);
  } else {
    for (fs::recursive_directory_iterator it(resolved.value.host, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (it->is_directory(ec) && (name == ".git" || name == ".kiln")) {
        it.disable_recursion_pending();
        continue;
      }
      if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;  // never follow links out
      files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());

  std::string out;
  std::size_t matches = 0, files_matched = 0;
  bool capped = false;
  std::vector<std::string> too_big;
  for (const auto& file : files) {
    std::string relative = file.lexically_relative(root).string();
    if (!glob_matches(glob, relative)) continue;
    if (std::error_code size_ec; fs::file_size(file, size_ec) > kMaxFileBytes && !size_ec) {
      too_big.push_back(relative);  // said below: a silent skip reads as "not in the code"
      continue;
    }
    auto bytes = read_bytes(file, kMaxFileBytes);
    if (!bytes.ok() || looks_binary(bytes.value)) continue;
    const std::string& text = bytes.value;
    bool any = false;
    std::size_t line_no = 0;
    for (std::size_t begin = 0; begin < text.size() && !capped; ++line_no) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + begin, end - begin);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(line.data()), line.size(), 0, 0, data.get(), nullptr);
      if (rc >= 0) {
        any = true;
        std::string shown(line.substr(0, kMaxLineChars));
        if (line.size() > kMaxLineChars) shown += " [...]";
        out += relative + ":" + std::to_string(line_no + 1) + ": " + shown + "\n";
        if (++matches >= kMaxMatches) capped = true;
      }
      begin = end + 1;
    }
    files_matched += any;
    if (capped) break;
  }
  if (matches == 0) out = "No matches for /" + pattern + "/" + (glob.empty() ? "" : " in files matching " + glob) + ".\n";
  if (capped) out += "[stopped at " + std::to_string(kMaxMatches) + " matches; narrow the pattern, path or glob]\n";
  if (!too_big.empty()) {
    out += "[not searched: " + std::to_string(too_big.size()) + " file(s) over " + std::to_string(kMaxFileBytes >> 20) +
           " MiB:";
    for (std::size_t i = 0; i < too_big.size() && i < 10; ++i) out += " " + too_big[i];
    if (too_big.size() > 10) out += " ...";
    out += "; search them with bash, e.g. grep -n]\n";
  }
  return {valid_utf8(out),
          {{"pattern", pattern}, {"matches", matches}, {"files", files_matched}, {"capped", capped}, {"not_searched", too_big}}};
}

}  // namespace

Tool grep_tool() {
  return {"grep",
          "Search files in the workspace for a regular expression (PCRE syntax), line by line. Returns file:line: text, "
          "at most 200 matches. .git and binary files are skipped.",
          {{"type", "object"},
           {"properties",
            {{"pattern", {{"type", "string"}, {"description", "Regular expression"}}},
             {"path", {{"type", "string"}, {"description", "File or directory to search, relative to /workspace (default: all)"}}},
             {"glob", {{"type", "string"}, {"description", "Only files whose path or name matches this glob, e.g. *.py"}}},
             {"ignore_case", {{"type", "boolean"}, {"description", "Case-insensitive match"}}}}},
           {"required", {"pattern"}}},
          grep};
}

}  // namespace kiln::tools
