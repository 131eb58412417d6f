// tokenizer_bench: encode/decode throughput of the Qwen BPE tokenizer on one core.
//
//   tokenizer_bench [--tokenizer FILE | --model DIR] [--corpus DIR] [--seconds S]
//
// Corpora: source code (every .cpp/.h/.cu under --corpus, default: this repository), prose (the
// .md files there) and a mixed Unicode text. Each encode row runs twice: "cold" (empty piece cache,
// a fresh tokenizer) and "warm" (steady state of a long-running engine). Prints a table and the
// command line. Default tokenizer: the real Qwen3 one in ../shared (if present) plus the tiny one.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/tiny_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using kiln::engine::Tokenizer;
using kiln::engine::TokenId;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of this thread: on a shared machine, MB per CPU-second is the one-core speed.
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string gather(const fs::path& root, const std::vector<std::string>& exts, std::size_t limit) {
  std::string out;
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied);
       it != fs::recursive_directory_iterator(); ++it) {
    const std::string p = it->path().string();
    if (p.find("/build") != std::string::npos || p.find("/.git") != std::string::npos ||
        p.find("/assets/") != std::string::npos) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    for (const auto& e : exts)
      if (it->path().extension() == e) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out += ss.str();
    if (out.size() >= limit) break;
  }
  return out;
}

std::string mixed_text(std::size_t bytes) {
  const std::string base =
      "Größe naïve café — Ünïcödé: 日本語のテキストと中文混合。Русский текст, ελληνικά, العربية. "
      "Emoji 🙂🚀 and numbers 1234567 3.14159; e\xCC\x81 vs é. <tool_call> stays text here.\n";
  std::string out;
  while (out.size() < bytes) out += base;
  return out;
}

struct Row {
  std::string tokenizer, corpus, mode;
  double mb, seconds, cpu_seconds;
  std::size_t tokens;
};

void print_row(const Row& r) {
  std::printf("| %-10s | %-8s | %-6s | %8.2f | %9.2f | %9.2f | %12.0f | %9.2f |\n", r.tokenizer.c_str(),
              r.corpus.c_str(), r.mode.c_str(), r.mb, r.mb / r.cpu_seconds, r.mb / r.seconds,
              r.tokens / r.cpu_seconds, r.mb * 1e6 / static_cast<double>(r.tokens));
}

// Encodes `text` in 64 KiB chunks (as a prompt builder would) for at least `seconds`.
Row run_encode(const Tokenizer& tok, const std::string& name, const std::string& corpus_name,
               const std::string& text, const std::string& mode, double seconds) {
  const std::size_t chunk = 64 * 1024;
  std::size_t bytes = 0, tokens = 0;
  const double t0 = now_s(), c0 = cpu_s();
  double t = t0;
  do {
    for (std::size_t i = 0; i < text.size(); i += chunk) {
      tokens += tok.encode(std::string_view(text).substr(i, chunk)).size();
    }
    bytes += text.size();
    t = now_s();
  } while (mode == "warm" && t - t0 < seconds);
  return {name, corpus_name, mode, bytes / 1e6, t - t0, cpu_s() - c0, tokens};
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, model_dir, corpus = KILN_SOURCE_DIR;
  double seconds = 2.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer") tokenizer_path = argv[i + 1];
    else if (a == "--model") model_dir = argv[i + 1];
    else if (a == "--corpus") corpus = argv[i + 1];
    else if (a == "--seconds") seconds = std::stod(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("command:");
  for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");

  const std::string code = gather(corpus, {".cpp", ".h", ".cu", ".hpp", ".cc"}, 8 << 20);
  const std::string prose = gather(corpus, {".md", ".txt"}, 4 << 20);
  const std::string mixed = mixed_text(2 << 20);
  std::printf("corpora: code %.2f MB (%s), prose %.2f MB, mixed unicode %.2f MB\n\n", code.size() / 1e6,
              corpus.c_str(), prose.size() / 1e6, mixed.size() / 1e6);

  struct Named {
    std::string name;
    std::function<kiln::engine::TokenizerLoad()> load;
  };
  std::vector<Named> tokenizers;
  if (!tokenizer_path.empty()) {
    tokenizers.push_back({"file", [&] { return Tokenizer::load_file(tokenizer_path); }});
  } else if (!model_dir.empty()) {
    tokenizers.push_back({"model", [&] { return Tokenizer::load_model_dir(model_dir); }});
  } else {
    const std::string shared = std::string(KILN_SOURCE_DIR) + "/../shared/assets/tokenizers/qwen3/tokenizer.json.gz";
    if (fs::exists(shared)) tokenizers.push_back({"qwen3", [=] { return Tokenizer::load_file(shared); }});
  }
  tokenizers.push_back({"tiny-32768", [] {
                          auto files = kiln::engine::make_tiny_tokenizer(32768);
                          return Tokenizer::load_json_text(files.tokenizer_json, files.tokenizer_config_json);
                        }});

  std::printf("| tokenizer  | corpus   | mode   |       MB | MB/cpu-s | MB/wall-s | tokens/cpu-s | bytes/tok |\n");
  std::printf("|------------|----------|--------|----------|----------|-----------|--------------|-----------|\n");
  std::vector<std::string> notes;
  for (const Named& n : tokenizers) {
    for (const auto& [cname, text] : {std::pair<std::string, const std::string*>{"code", &code},
                                      {"prose", &prose}, {"mixed", &mixed}}) {
      if (text->empty()) continue;
      const double l0 = now_s();
      auto load = n.load();  // fresh tokenizer: empty cache
      const double load_s = now_s() - l0;
      if (!load.ok()) {
        std::fprintf(stderr, "%s: %s\n", n.name.c_str(), load.error.c_str());
        return 1;
      }
      if (cname == "code") {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s: load %.2f s, vocab %zu", n.name.c_str(), load_s,
                      load.tokenizer->vocab_size());
        notes.push_back(buf);
      }
      print_row(run_encode(*load.tokenizer, n.name, cname, *text, "cold", seconds));
      print_row(run_encode(*load.tokenizer, n.name, cname, *text, "warm", seconds));
      if (cname == "code") {
        const auto ids = load.tokenizer->encode(*text);
        const double d0 = now_s();
        const std::string back = load.tokenizer->decode(ids);
        const double d = now_s() - d0;
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s: decode %.1f MB/s on code (round trip %s)", n.name.c_str(),
                      back.size() / 1e6 / d, back == *text ? "exact" : "DIFFERS");
        notes.push_back(buf);
      }
    }
  }
  std::printf("\n");
  for (const auto& s : notes) std::printf("%s\n", s.c_str());
  return 0;
}
