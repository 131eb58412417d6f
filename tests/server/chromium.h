// Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: the
// browser reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4), so a
// test can watch a page that is still streaming (virtual time would not wait for an open stream)
// and take a screenshot at the moment it chooses. No network: the page is on a loopback server.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::server::testing {

class Chromium {
 public:
  explicit Chromium(const std::filesystem::path& profile) {
    ::signal(SIGPIPE, SIG_IGN);  // a dead browser must fail the test, not kill it
    int to[2], from[2];
    if (::pipe(to) != 0 || ::pipe(from) != 0) {
      error_ = "pipe failed";
      return;
    }
    std::string binary = std::filesystem::exists("/usr/bin/chromium") ? "/usr/bin/chromium" : "chromium";
    std::vector<std::string> args = {binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                                     "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage",
                                     "--window-size=1280,1000", "--user-data-dir=" + profile.string(), "about:blank"};
    pid_ = ::fork();
    if (pid_ == 0) {
      // Park both ends above 4 first so the dup2s below cannot clobber each other.
      int in = ::fcntl(to[0], F_DUPFD, 10), out = ::fcntl(from[1], F_DUPFD, 10);
      ::dup2(in, 3);
      ::dup2(out, 4);
      int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      for (int fd = 5; fd < 1024; ++fd) ::close(fd);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    to_fd_ = to[1];
    from_fd_ = from[0];
  }

  ~Chromium() {
    if (pid_ <= 0) return;
    command("Browser.close", nlohmann::json::object(), false, std::chrono::seconds(3));
    ::close(to_fd_);
    ::close(from_fd_);
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  const std::string& error() const { return error_; }

  // Attaches to the browser's page and navigates it to `url`; "" or what failed.
  std::string open(const std::string& url) {
    if (!error_.empty()) return error_;
    auto targets = command("Target.getTargets", nlohmann::json::object(), false);
    if (!targets) return error_;
    std::string target;
    for (const auto& t : (*targets)["targetInfos"])
      if (t["type"] == "page") target = t["targetId"];
    if (target.empty()) {
      auto created = command("Target.createTarget", {{"url", "about:blank"}}, false);
      if (!created) return error_;
      target = (*created)["targetId"];
    }
    auto attached = command("Target.attachToTarget", {{"targetId", target}, {"flatten", true}}, false);
    if (!attached) return error_;
    session_ = (*attached)["sessionId"];
    if (!command("Page.navigate", {{"url", url}}, true)) return error_;
    return "";
  }

  // The value of a JavaScript expression in the page (JSON-serialisable), or nullopt.
  std::optional<nlohmann::json> eval(const std::string& expression) {
    auto r = command("Runtime.evaluate", {{"expression", expression}, {"returnByValue", true}}, true);
    if (!r || !r->contains("result") || r->contains("exceptionDetails")) return std::nullopt;
    return (*r)["result"].value("value", nlohmann::json());
  }

  // Polls `expression` every 100 ms until it is true; false at the deadline.
  bool wait_until(const std::string& expression, std::chrono::milliseconds deadline) {
    auto end = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < end) {
      auto v = eval(expression);
      if (v && v->is_boolean() && v->get<bool>()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Saves a PNG of the page as it is now.
  bool screenshot(const std::filesystem::path& png) {
    auto r = command("Page.captureScreenshot", {{"format", "png"}}, true);
    if (!r || !(*r)["data"].is_string()) return false;
    std::ofstream(png, std::ios::binary) << base64_decode((*r)["data"].get<std::string>());
    return std::filesystem::exists(png);
  }

 private:
  // Sends one command and waits for its reply (events in between are skipped).
  std::optional<nlohmann::json> command(const std::string& method, nlohmann::json params, bool on_page,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    int id = next_id_++;
    nlohmann::json msg = {{"id", id}, {"method", method}, {"params", std::move(params)}};
    if (on_page) msg["sessionId"] = session_;
    std::string bytes = msg.dump();
    bytes.push_back('\0');
    for (size_t off = 0; off < bytes.size();) {
      ssize_t n = ::write(to_fd_, bytes.data() + off, bytes.size() - off);
      if (n <= 0) {
        error_ = "chromium closed its command pipe (" + method + ")";
        return std::nullopt;
      }
      off += static_cast<size_t>(n);
    }
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      size_t nul;
      while ((nul = buffer_.find('\0')) != std::string::npos) {
        nlohmann::json reply = nlohmann::json::parse(buffer_.substr(0, nul), nullptr, false);
        buffer_.erase(0, nul + 1);
        if (reply.is_object() && reply.value("id", -1) == id) {
          if (reply.contains("error")) {
            error_ = method + ": " + reply["error"].dump();
            return std::nullopt;
          }
          return reply["result"];
        }
      }
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
      pollfd p{from_fd_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, left) <= 0) {
        error_ = "no reply from chromium to " + method;
        return std::nullopt;
      }
      char chunk[65536];
      ssize_t n = ::read(from_fd_, chunk, sizeof chunk);
      if (n <= 0) {
        error_ = "chromium exited (waiting for " + method + ")";
        return std::nullopt;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  static std::string base64_decode(const std::string& in) {
    std::string out;
    int value = 0, bits = -8;
    for (char c : in) {
      int d = c >= 'A' && c <= 'Z'   ? c - 'A'
              : c >= 'a' && c <= 'z' ? c - 'a' + 26
              : c >= '0' && c <= '9' ? c - '0' + 52
              : c == '+'             ? 62
              : c == '/'             ? 63
                                     : -1;
      if (d < 0) continue;  // '=' padding
      value = ((value << 6) | d) & 0xFFFFFF;
      bits += 6;
      if (bits >= 0) {
        out.push_back(static_cast<char>((value >> bits) & 0xFF));
        bits -= 8;
      }
    }
    return out;
  }

  pid_t pid_ = -1;
  int to_fd_ = -1, from_fd_ = -1;
  int next_id_ = 1;
  std::string session_;
  std::string buffer_;
  std::string error_;
};

}  // namespace kiln::server::testing
