#include "test_support.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace kiln::agent::testing {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("kiln-agent-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

TestStore::TestStore(const std::filesystem::path& dir, bool fake_clock) {
  store::StoreOptions options;
  options.path = (dir / "kiln.db").string();
  if (fake_clock) options.now_ms = [c = clock] { return c->load(); };
  auto opened = store::Store::open(options);
  if (!opened.ok()) ADD_FAILURE() << "store: " << opened.error().message;
  else store = std::move(opened.value());
}

int shell(const std::string& command) {
  int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string make_example_repo(const std::string& name, const std::filesystem::path& dest) {
  std::string script = std::string(KILN_SOURCE_DIR) + "/examples/make-repo.sh";
  std::string command = "sh '" + script + "' '" + name + "' '" + dest.string() + "' >/dev/null";
  if (shell(command) != 0) return "make-repo.sh failed for " + name;
  return "";
}

}  // namespace kiln::agent::testing
