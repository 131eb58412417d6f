#include "server/config.h"

#include <charconv>
#include <filesystem>
#include <cstdint>
#include <limits>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/cache/kv_pool.h"
#include "engine/capacity.h"
#include "engine/cpu/quant.h"
#include "store/store.h"

namespace kiln::server {

using nlohmann::json;

bool parse_listen_address(const std::string& text, ListenAddress& out, std::string& error) {
  std::string host;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      error = "expected [ipv6]:port, got '" + text + "'";
      return false;
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      error = "expected host:port, got '" + text + "'";
      return false;
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size() || port > 65535) {
    error = "bad port '" + port_text + "'";
    return false;
  }
  if (host.empty()) host = "127.0.0.1";
  out.host = host;
  out.port = static_cast<uint16_t>(port);
  return true;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

bool parse_byte_size(const std::string& text, uint64_t& bytes) {
  const int64_t parsed = engine::parse_bytes(text);  // the one parser: the same spellings everywhere
  if (parsed <= 0) return false;
  bytes = static_cast<uint64_t>(parsed);
  return true;
}

namespace {

// A tiny typed reader over one JSON object that remembers its path for error messages and
// rejects keys nobody asked for.
class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  bool has(const std::string& key) {
    seen_.insert(key);
    return obj_.contains(key) && !obj_.at(key).is_null();
  }
  const json& at(const std::string& key) const { return obj_.at(key); }

  std::optional<std::string> string(const std::string& key, std::string& out) {
    if (!has(key)) return std::nullopt;
    if (!at(key).is_string()) return field(key) + ": expected a string";
    out = at(key).get<std::string>();
    return std::nullopt;
  }
  template <typename Int>
  std::optional<std::string> integer(const std::string& key, Int& out, int64_t min_value,
                                     std::optional<int64_t> upper = std::nullopt) {
    if (!has(key)) return std::nullopt;
    const json& v = at(key);
    // The upper bound of Int too (4294967297 for an int field used to wrap around to 1), or a
    // tighter one the caller gives.
    int64_t max_value = static_cast<int64_t>(std::min<uint64_t>(std::numeric_limits<Int>::max(), INT64_MAX));
    if (upper && *upper < max_value) max_value = *upper;
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(max_value)) ||
        v.get<int64_t>() < min_value || v.get<int64_t>() > max_value) {
      return field(key) + ": expected an integer from " + std::to_string(min_value) + " to " + std::to_string(max_value);
    }
    out = static_cast<Int>(v.get<int64_t>());
    return std::nullopt;
  }
  std::optional<std::string> number(const std::string& key, double& out, double lo, double hi) {
    if (!has(key)) return std::nullopt;
    const json& v = at(key);
    if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi) {
      return field(key) + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    }
    out = v.get<double>();
    return std::nullopt;
  }
  std::optional<std::string> bytes(const std::string& key, uint64_t& out) {
    if (!has(key)) return std::nullopt;
    const json& v = at(key);
    if (v.is_number_integer() && v.get<int64_t>() > 0) {
      out = v.get<uint64_t>();
      return std::nullopt;
    }
    if (v.is_string() && parse_byte_size(v.get<std::string>(), out)) return std::nullopt;
    return field(key) + ": expected a byte count or a size like \"36GiB\"";
  }
  // Call last: names the first key that no accessor asked about.
  std::optional<std::string> reject_unknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) return field(it.key()) + ": unknown field";
    }
    return std::nullopt;
  }

 private:
  const json& obj_;
  std::string path_;
  std::set<std::string> seen_;
};

#define KILN_TRY(expr)                         \
  do {                                         \
    if (auto kiln_err_ = (expr)) return kiln_err_; \
  } while (0)

std::optional<std::string> parse_sampling(const json& j, const std::string& path, SamplingConfig& s) {
  if (!j.is_object()) return path + ": expected an object";
  ObjectReader r(j, path);
  KILN_TRY(r.number("temperature", s.temperature, 0.0, 10.0));
  KILN_TRY(r.number("top_p", s.top_p, 0.0, 1.0));
  KILN_TRY(r.integer("top_k", s.top_k, 0));
  KILN_TRY(r.integer("seed", s.seed, 0));
  return r.reject_unknown();
}

// The turns of a scripted test model: checked here so the dispatcher can trust them.
std::optional<std::string> check_scripted_turns(const json& turns, const std::string& path) {
  if (!turns.is_array() || turns.empty()) return path + ": expected a non-empty array of turns";
  for (size_t i = 0; i < turns.size(); ++i) {
    std::string at = path + "[" + std::to_string(i) + "]";
    if (!turns[i].is_object()) return at + ": expected an object";
    ObjectReader r(turns[i], at);
    std::string text;
    KILN_TRY(r.string("reasoning", text));
    KILN_TRY(r.string("text", text));
    int decode_ms = 0;
    KILN_TRY(r.integer("decode_ms_per_token", decode_ms, 0));
    if (r.has("calls")) {
      const json& calls = r.at("calls");
      if (!calls.is_array()) return r.field("calls") + ": expected an array";
      for (size_t c = 0; c < calls.size(); ++c) {
        std::string call_path = r.field("calls") + "[" + std::to_string(c) + "]";
        if (!calls[c].is_object()) return call_path + ": expected an object";
        ObjectReader cr(calls[c], call_path);
        std::string name;
        KILN_TRY(cr.string("name", name));
        if (name.empty()) return cr.field("name") + ": required, a tool name";
        if (cr.has("arguments") && !cr.at("arguments").is_object()) return cr.field("arguments") + ": expected an object";
        KILN_TRY(cr.reject_unknown());
      }
    }
    KILN_TRY(r.reject_unknown());
  }
  return std::nullopt;
}

std::optional<std::string> parse_model(const json& j, const std::string& path, ModelConfig& m) {
  if (!j.is_object()) return path + ": expected an object";
  ObjectReader r(j, path);
  KILN_TRY(r.string("name", m.name));
  KILN_TRY(r.string("path", m.path));
  if (m.name.empty()) return r.field("name") + ": required, a non-empty string";
  if (r.has("scripted_test_turns")) {
    KILN_TRY(check_scripted_turns(r.at("scripted_test_turns"), r.field("scripted_test_turns")));
    m.scripted_test_turns = r.at("scripted_test_turns").dump();
  }
  if (m.path.empty() && m.scripted_test_turns.empty()) return r.field("path") + ": required, a model directory";
  KILN_TRY(r.integer("threads", m.threads, 0));
  if (r.has("kv_budget") && r.at("kv_budget") == "auto") {
    m.kv_budget_bytes = 0;
  } else if (auto err = r.bytes("kv_budget", m.kv_budget_bytes)) {
    return *err + " or \"auto\"";
  }
  KILN_TRY(r.integer("max_sessions", m.max_sessions, 1));
  KILN_TRY(r.string("weights", m.weights));
  if (!engine::cpu::parse_weight_choice(m.weights))
    return r.field("weights") + ": expected " + std::string(engine::cpu::kWeightChoicesText);
  KILN_TRY(r.string("cache_dtype", m.cache_dtype));
  if (!engine::parse_cache_dtype(m.cache_dtype)) return r.field("cache_dtype") + ": expected f32 or bf16";
  KILN_TRY(r.integer("idle_unload_seconds", m.idle_unload_seconds, 0));
  KILN_TRY(r.integer("draft_tokens", m.draft_tokens, 0, 16));
  if (r.has("sampling")) KILN_TRY(parse_sampling(r.at("sampling"), r.field("sampling"), m.sampling));
  return r.reject_unknown();
}

std::optional<std::string> parse_limits(const json& j, const std::string& path, LimitsConfig& l) {
  if (!j.is_object()) return path + ": expected an object";
  ObjectReader r(j, path);
  // The store's bounds: a default above them would make every build without limits a 400.
  KILN_TRY(r.integer("steps", l.steps, 1, store::kMaxLimitSteps));
  KILN_TRY(r.integer("tokens", l.tokens, 1, store::kMaxLimitTokens));
  KILN_TRY(r.integer("wall_seconds", l.wall_seconds, 1, store::kMaxLimitWallSeconds));
  return r.reject_unknown();
}

}  // namespace

std::optional<std::string> parse_config_json(const std::string& text, ServerConfig& c) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {  // its message says where: "at line L, column C"
    std::string what = e.what();
    const size_t at = what.find("parse error");
    return "not valid JSON: " + (at == std::string::npos ? what : what.substr(at));
  }
  if (!doc.is_object()) return "expected a JSON object at the top level";
  ObjectReader r(doc, "");
  std::string listen;
  KILN_TRY(r.string("listen", listen));
  if (!listen.empty()) {
    std::string err;
    if (!parse_listen_address(listen, c.listen, err)) return "listen: " + err;
  }
  KILN_TRY(r.string("db", c.db_path));
  KILN_TRY(r.string("token", c.token));
  KILN_TRY(r.string("var_dir", c.var_dir));
  if (!r.has("db") && r.has("var_dir")) c.db_path = c.var_dir + "/kiln.db";  // the default database lives there
  KILN_TRY(r.integer("workers", c.workers, 0));
  KILN_TRY(r.integer("io_threads", c.io_threads, 1));
  KILN_TRY(r.bytes("max_body_bytes", c.max_body_bytes));
  KILN_TRY(r.bytes("sse_buffer_bytes", c.sse_buffer_bytes));
  KILN_TRY(r.integer("sse_ping_seconds", c.sse_ping_seconds, 1));
  // Clients give up on a stream silent for 45 s (kiln logs --follow); pings must come sooner.
  if (c.sse_ping_seconds > 30) return "sse_ping_seconds: expected an integer from 1 to 30";
  KILN_TRY(r.integer("lease_seconds", c.lease_seconds, 1));
  KILN_TRY(r.bytes("memory_budget", c.memory_budget_bytes));
  KILN_TRY(r.string("default_model", c.default_model));
  if (r.has("limits")) KILN_TRY(parse_limits(r.at("limits"), "limits", c.limits));
  if (r.has("models")) {
    const json& models = r.at("models");
    if (!models.is_array()) return "models: expected an array";
    c.models.clear();
    std::set<std::string> names;
    for (size_t i = 0; i < models.size(); ++i) {
      std::string path = "models[" + std::to_string(i) + "]";
      ModelConfig m;
      KILN_TRY(parse_model(models[i], path, m));
      if (!names.insert(m.name).second) return path + ".name: duplicate model name '" + m.name + "'";
      c.models.push_back(std::move(m));
    }
  }
  KILN_TRY(r.reject_unknown());
  if (!c.default_model.empty()) {
    bool found = false;
    for (const ModelConfig& m : c.models) found = found || m.name == c.default_model;
    if (!found) return "default_model: '" + c.default_model + "' is not one of models[].name";
  }
  return std::nullopt;
}

std::optional<std::string> load_config_file(const std::string& path, ServerConfig& config) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "'" + path + "' is a directory, not a config file";
  std::ifstream in(path);
  if (!in) return "cannot read config file '" + path + "'";
  std::stringstream ss;
  ss << in.rdbuf();
  if (auto err = parse_config_json(ss.str(), config)) return path + ": " + *err;
  return std::nullopt;
}

std::string effective_default_model(const ServerConfig& config) {
  if (!config.default_model.empty()) return config.default_model;
  return config.models.empty() ? std::string() : config.models.front().name;
}

}  // namespace kiln::server
