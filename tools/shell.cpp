// `bash`: one command line through the sandbox. The model sees the exit status and about 10 KiB
// of output (head + tail, with a marker); longer output is saved whole (up to the sandbox's
// capture cap) to .kiln/outputs/<n>.log in the workspace, which .git/info/exclude keeps out of
// diffs and commits.
#include <algorithm>

#include "tools/common.h"

namespace kiln::tools {

namespace {

constexpr std::size_t kSavedHalf = 4u << 20;  // the saved log keeps 4 MiB of head and of tail

ToolResult bash(const nlohmann::json& args, Context& ctx) {
  std::string command = args["command"];
  if (command.find_first_not_of(" \t\n") == std::string::npos) return fail("command is empty");
  sandbox::Policy policy = ctx.policy;
  policy.workspace = ctx.workspace;
  auto limit = ctx.max_command_timeout;
  if (args.contains("timeout")) {
    long long seconds = args["timeout"];
    if (seconds <= 0) return fail("timeout must be a positive number of seconds");
    // Compared in seconds: converting a huge value to milliseconds first would overflow.
    if (seconds <= std::chrono::duration_cast<std::chrono::seconds>(limit).count() && std::chrono::seconds(seconds) < limit)
      limit = std::chrono::seconds(seconds);
  }
  policy.limits.wall_timeout = limit;
  policy.limits.output_head_bytes = std::max(policy.limits.output_head_bytes, kSavedHalf);
  policy.limits.output_tail_bytes = std::max(policy.limits.output_tail_bytes, kSavedHalf);
  sandbox::RunOptions options;
  options.cancel = ctx.cancel;
  sandbox::Result r = sandbox::run({"bash", "-c", command}, policy, options);
  if (!r.ok()) {
    return fail("the sandbox could not run the command: " + r.error, {{"infra_error", true}, {"sandbox", r.to_json()}});
  }

  std::string output = r.joined_output();
  std::string saved;
  if (output.size() > kShownOutputBytes) {
    saved = ".kiln/outputs/" + std::to_string(++ctx.outputs_saved) + ".log";
    auto written = write_bytes(ctx.workspace, ctx.workspace / saved, output);
    if (!written.ok()) saved = "(could not save: " + written.error + ")";
    std::size_t half = kShownOutputBytes / 2;
    std::uint64_t cut = r.total_output_bytes - 2 * half;  // the marker, if any, lies inside the cut
    output = output.substr(0, half) + "\n[... " + std::to_string(cut) + " bytes cut; full output saved to /workspace/" +
             saved + " ...]\n" + output.substr(output.size() - half);
  }
  std::string status;
  if (r.cancelled) {
    status = "cancelled";
  } else if (r.timed_out) {
    status = "timed out after " + std::to_string(limit.count() / 1000) + " s; the command was killed";
  } else {
    status = "exit code " + std::to_string(r.exit_code);
  }
  nlohmann::json data = r.to_json();
  data.erase("output");
  data["command"] = command;
  data["timeout_seconds"] = limit.count() / 1000.0;
  if (!saved.empty()) data["saved_output"] = saved;
  bool error = r.cancelled || r.timed_out || r.exit_code != 0;
  return {valid_utf8("[" + status + "]\n" + output), data, error, false};
}

}  // namespace

Tool bash_tool() {
  return {"bash",
          "Run a bash command line in /workspace inside the sandbox (no network, only /workspace and /tmp writable). "
          "Returns the exit code and the combined stdout/stderr; long output is cut to its start and end, with the "
          "full text saved in the workspace. Do not start interactive programs.",
          {{"type", "object"},
           {"properties",
            {{"command", {{"type", "string"}, {"description", "The command line, run with bash -c"}}},
             {"timeout", {{"type", "integer"}, {"description", "Seconds before the command is killed (capped by the build's limit)"}}}}},
           {"required", {"command"}}},
          bash};
}

}  // namespace kiln::tools
