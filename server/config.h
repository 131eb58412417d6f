// kiln serve's configuration: the JSON file (`--config kiln.json`), command-line overrides and
// defaults. Parsing is strict: an unknown field or a wrong type is an error naming the field
// (e.g. "models[1].threads: expected a positive integer").
//
// Example file:
//   {"listen": "127.0.0.1:8080", "db": "var/kiln.db", "workers": 2,
//    "models": [{"name": "qwen3.6-35b-a3b", "path": "/models/Qwen3.6-35B-A3B", "threads": 16,
//                "kv_budget": "36GiB", "max_sessions": 16,
//                "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}}],
//    "default_model": "qwen3.6-35b-a3b",
//    "limits": {"steps": 100, "tokens": 200000, "wall_seconds": 3600}}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::server {

struct ListenAddress {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
};

// Parses "host:port" (IPv6 as "[::1]:8080"). Returns false with `error` set on bad input.
bool parse_listen_address(const std::string& text, ListenAddress& out, std::string& error);

// True for 127.0.0.0/8, ::1 and "localhost": the addresses that need no token.
bool is_loopback_host(const std::string& host);

struct SamplingConfig {
  double temperature = 0.6;
  double top_p = 0.95;
  int top_k = 20;
  uint64_t seed = 0;  // 0: a fresh seed per build
};

struct ModelConfig {
  std::string name;          // what builds ask for ("model": "...")
  std::string path;          // a Hugging Face model directory (config.json + safetensors)
  int threads = 0;           // CPU threads for this model; 0 = all cores
  // Memory for the KV cache and fixed state of all its sessions. 0 = "auto" (the default): room
  // for each of max_sessions builds to reach kAutoKvTokensPerSession tokens (or the model's
  // context if shorter), within half the memory the weights leave (resolve_kv_budgets).
  uint64_t kv_budget_bytes = 0;
  int max_sessions = 4;      // concurrent builds on this model
  // Weight storage on CPU: "q8" (default: ~2x less memory and faster decode than bf16), "q4",
  // "bf16", or "stored" (the checkpoint's dtype, exact). Converted once and cached next to the model.
  std::string weights = "q8";
  std::string cache_dtype = "f32";  // KV/conv cache: "f32" (exact) or "bf16" (2x the tokens per byte)
  // Prompt-lookup speculative decoding: most draft tokens verified per step (0: off). The output
  // is the same either way; drafts are verified only where they are expected to save time.
  int draft_tokens = 8;
  SamplingConfig sampling;
  bool demo = false;         // true for the generated random-weight demo model
  int idle_unload_seconds = 0;  // unload after this long unused (0 = only when memory is short)
  // A SCRIPTED TEST MODEL (for tests of the whole server; never a default): the JSON array of
  // assistant turns it replays for every build, each {"reasoning", "text", "calls": [{"name",
  // "arguments"}], "decode_ms_per_token"}. Non-empty means no engine and no `path`; the log and
  // /v1/models say what it is. Config key: "scripted_test_turns".
  std::string scripted_test_turns;
};

struct LimitsConfig {
  int64_t steps = 50;
  int64_t tokens = 100000;
  int64_t wall_seconds = 1800;
};

struct ServerConfig {
  ListenAddress listen;
  std::string db_path = "var/kiln.db";
  std::string token;             // bearer token; required unless listening on loopback
  int workers = 0;               // 0: one per session slot of the configured models
  bool start_workers = true;     // false: HTTP only (tests that play the worker themselves)
  int io_threads = 2;            // threads running the HTTP io_context
  uint64_t max_body_bytes = 1 << 20;
  uint64_t sse_buffer_bytes = 1 << 20;  // per SSE client; above half of it a client is paused
  int sse_ping_seconds = 15;
  int sse_stall_seconds = 30;  // a client paused this long is dropped (not in kiln.json; tests shorten it)
  std::vector<ModelConfig> models;
  std::string default_model;     // "" = the first model
  LimitsConfig limits;
  std::string var_dir = "var";   // where the demo model and the default database (unless "db" is set) live
  // A worker's lease on its build: renewed every lease/4 (at most 2 s); when a worker (or the
  // whole process) dies, recovery requeues its build this long after the last renewal. The
  // server runs recovery at start and every max(1 s, lease/2).
  int lease_seconds = 30;
  // Memory for loaded engine models (their weights + kv_budget); loading one past it unloads idle
  // models, least recently used first. 0 = no budget (models stay loaded unless idle-unloaded).
  uint64_t memory_budget_bytes = 0;
};

// Parses a configuration document over `base` (fields absent from the file keep base's values).
// Returns an error message naming the field at fault, or nullopt.
std::optional<std::string> parse_config_json(const std::string& text, ServerConfig& config);

// Reads and parses `path`; the error names the file.
std::optional<std::string> load_config_file(const std::string& path, ServerConfig& config);

// "36GiB", "512MiB", "1000000" (bytes) -> bytes. False on anything else.
bool parse_byte_size(const std::string& text, uint64_t& bytes);

// The model a build without "model" uses: default_model, else the first model, else "".
std::string effective_default_model(const ServerConfig& config);

}  // namespace kiln::server
