// probe(): which isolation layers work on this host, found by starting real sandboxes in a
// scratch workspace and looking from the inside.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <sstream>

#include "sandbox/cgroup.h"
#include "sandbox/runner_internal.h"
#include "sandbox/sandbox.h"

namespace kiln::sandbox {

namespace fs = std::filesystem;

namespace {

// One sandboxed shell prints key=value lines about what it sees.
constexpr const char* kProbeScript = R"SH(
echo "uid_map=$(awk '{print $1":"$2; exit}' /proc/self/uid_map)"
echo "ifaces=$(awk -F: 'NR>2{gsub(/ /,"",$1); printf "%s,", $1}' /proc/net/dev)"
if touch /etc/kiln-probe 2>/dev/null; then echo etc=writable; else echo etc=readonly; fi
if touch /usr/kiln-probe 2>/dev/null; then echo usr=writable; else echo usr=readonly; fi
if touch /workspace/kiln-probe 2>/dev/null; then echo ws=writable; else echo ws=readonly; fi
echo "nproc=$(awk '/^Max processes/{print $3}' /proc/self/limits)"
echo "as=$(awk '/^Max address space/{print $4}' /proc/self/limits)"
echo "pid=$$"
)SH";

std::map<std::string, std::string> parse_lines(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

}  // namespace

ProbeReport probe(const Policy& base) {
  ProbeReport report;
  auto add = [&](std::string name, bool ok, std::string detail) {
    report.layers.push_back({std::move(name), ok, std::move(detail)});
    return ok;
  };
  std::string bwrap = find_bwrap(base);
  if (!add("bwrap", !bwrap.empty(), bwrap.empty() ? "not found on PATH (Debian package 'bubblewrap')" : bwrap)) {
    report.reason = "bwrap not found";
    return report;
  }
  bool root = geteuid() == 0;
  char tmpl[] = "/tmp/kiln-probe-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    report.reason = "cannot create a scratch workspace under /tmp";
    return report;
  }
  fs::path scratch = tmpl;
  chmod(tmpl, 0755);
  Policy policy = base;
  policy.workspace = scratch;
  policy.mode = Mode::bwrap;
  policy.limits.wall_timeout = std::chrono::seconds(10);
  std::string prep = prepare_workspace(policy);
  Result r = prep.empty() ? run({"sh", "-c", kProbeScript}, policy) : Result{};
  if (!prep.empty()) r.error = prep;
  // The host owner of a file the command created is the host uid the command ran as (the uid
  // map seen from inside may go through bwrap's intermediate namespace, so it is not trusted).
  struct stat made {};
  bool made_file = stat((scratch / "kiln-probe").c_str(), &made) == 0;
  std::error_code ec;
  fs::remove_all(scratch, ec);

  bool started = r.ok() && r.exit_code == 0;
  add("sandbox starts", started, started ? "bwrap ran a shell in " + std::to_string(r.wall_seconds * 1000).substr(0, 5) + " ms"
                                         : (r.ok() ? "exit " + std::to_string(r.exit_code) + ": " + r.output : r.error));
  if (!started) {
    report.reason = "bwrap cannot start a sandbox here: " + (r.ok() ? r.output : r.error);
    return report;
  }
  auto kv = parse_lines(r.output);
  std::string map = kv["uid_map"];  // "inside:outside"
  add("user namespace", !map.empty(), "uid map inside the sandbox " + map);
  bool unprivileged = made_file && made.st_uid != 0;
  add("unprivileged uid", unprivileged,
      made_file ? "commands run as host uid " + std::to_string(made.st_uid) +
                      (root ? " (kiln is root and drops to it before bwrap)" : " (kiln's own uid)")
                : std::string("could not tell: the command created no file"));
  bool net = kv["ifaces"] == "lo,";
  add("network isolation", net, "interfaces: " + kv["ifaces"]);
  bool ro = kv["etc"] == "readonly" && kv["usr"] == "readonly";
  add("read-only system", ro, "/etc " + kv["etc"] + ", /usr " + kv["usr"]);
  bool ws = kv["ws"] == "writable";
  add("workspace writable", ws, "/workspace " + kv["ws"]);
  add("pid namespace", kv["pid"] == "2" || kv["pid"] == "1", "shell pid inside: " + kv["pid"]);
  add("rlimits", kv["nproc"] == std::to_string(policy.limits.max_processes),
      "max processes " + kv["nproc"] + ", address space " + kv["as"] + " bytes");
  const CgroupSupport& cg = CgroupSupport::get();
  bool cg_memory = false, cg_pids = false;
  for (const auto& e : r.enforced) {
    if (e.find("memory") != std::string::npos && e.rfind("cgroup", 0) == 0) cg_memory = true;
    if (e.find("pids") != std::string::npos && e.rfind("cgroup", 0) == 0) cg_pids = true;
  }
  add("cgroup memory limit", cg_memory, cg_memory ? "in force" : "not in force (RLIMIT_AS only): " + cg.detail);
  add("cgroup pids limit", cg_pids, cg_pids ? "in force" : "not in force (RLIMIT_NPROC only): " + cg.detail);
  add("cgroups found", cg.memory() || cg.pids(), cg.detail);

  report.usable = unprivileged && net && ro && ws;
  if (!report.usable) {
    for (const auto& layer : report.layers) {
      if (!layer.ok && (layer.name == "unprivileged uid" || layer.name == "network isolation" ||
                        layer.name == "read-only system" || layer.name == "workspace writable")) {
        report.reason = layer.name + " does not hold: " + layer.detail;
        break;
      }
    }
  }
  return report;
}

nlohmann::json ProbeReport::to_json() const {
  nlohmann::json layers_json = nlohmann::json::array();
  for (const auto& l : layers) layers_json.push_back({{"name", l.name}, {"ok", l.ok}, {"detail", l.detail}});
  nlohmann::json j = {{"usable", usable}, {"layers", layers_json}};
  if (!usable) j["reason"] = reason;
  return j;
}

std::string ProbeReport::to_text() const {
  std::ostringstream out;
  for (const auto& l : layers) out << (l.ok ? "  ok   " : "  --   ") << l.name << ": " << l.detail << "\n";
  out << (usable ? "sandbox usable: builds will run commands under bwrap\n"
                 : "sandbox NOT usable: builds fail with infra_error: " + reason + "\n");
  return out.str();
}

}  // namespace kiln::sandbox
