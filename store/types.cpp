// Names of the store's enums, the task key, and JSON text for API layers.
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>

#include "store/store.h"

namespace kiln::store {
namespace {

constexpr std::array<std::string_view, 6> kStatusNames = {"queued", "running",   "succeeded",
                                                          "failed", "cancelled", "error"};
constexpr std::array<std::string_view, 9> kReasonNames = {"verified",   "verify_failed", "no_verify",
                                                          "step_limit", "token_limit",   "time_limit",
                                                          "cancelled",  "infra_error",   "model_error"};

template <class Enum, size_t N>
std::optional<Enum> parse_enum(const std::array<std::string_view, N>& names, std::string_view text) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

template <class T>
nlohmann::json opt(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json metrics_json(const BuildMetrics& m) {
  return {{"tokens_prefilled", m.tokens_prefilled},
          {"tokens_cached", m.tokens_cached},
          {"tokens_generated", m.tokens_generated},
          {"tokens_reasoning", m.tokens_reasoning},
          {"steps", m.steps},
          {"tool_calls", m.tool_calls},
          {"tool_calls_total", m.tool_calls_total()},
          {"seconds_queue", m.seconds_queue},
          {"seconds_setup", m.seconds_setup},
          {"seconds_prefill", m.seconds_prefill},
          {"seconds_decode", m.seconds_decode},
          {"seconds_tools", m.seconds_tools},
          {"seconds_verify", m.seconds_verify},
          {"seconds_wall", m.seconds_wall},
          {"seconds_model_wait", m.seconds_model_wait}};
}

}  // namespace

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::not_found:
      return "not_found";
    case ErrorCode::fenced:
      return "fenced";
    case ErrorCode::conflict:
      return "conflict";
    case ErrorCode::busy:
      return "busy";
    case ErrorCode::io:
      return "io";
    case ErrorCode::corrupt:
      return "corrupt";
    case ErrorCode::schema_too_new:
      return "schema_too_new";
    case ErrorCode::internal:
      return "internal";
  }
  return "internal";
}

std::string_view to_string(BuildStatus status) { return kStatusNames[static_cast<size_t>(status)]; }
std::string_view to_string(OutcomeReason reason) { return kReasonNames[static_cast<size_t>(reason)]; }
std::optional<BuildStatus> parse_build_status(std::string_view text) {
  return parse_enum<BuildStatus>(kStatusNames, text);
}
std::optional<OutcomeReason> parse_outcome_reason(std::string_view text) {
  return parse_enum<OutcomeReason>(kReasonNames, text);
}
bool is_terminal(BuildStatus status) {
  return status != BuildStatus::queued && status != BuildStatus::running;
}

int64_t BuildMetrics::tool_calls_total() const {
  int64_t total = 0;
  for (const auto& [tool, count] : tool_calls) total += count;
  return total;
}

std::string task_key(const BuildSpec& spec) {
  // FNV-1a 64 over length-prefixed fields, so ("ab","c") and ("a","bc") differ, and a missing
  // verify differs from an empty one. Not cryptographic: it only groups equal tasks.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    std::string len = std::to_string(s.size()) + ":";
    for (char c : len) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  };
  mix(spec.repo);
  mix(spec.ref);
  mix(spec.task);
  mix(spec.verify ? "v" + *spec.verify : std::string("-"));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string to_json(const BuildMetrics& metrics) { return metrics_json(metrics).dump(); }

std::string to_json(const Build& b) {
  nlohmann::json j = {
      {"id", b.id},
      {"repo", b.spec.repo},
      {"ref", b.spec.ref},
      {"task", b.spec.task},
      {"verify", opt(b.spec.verify)},
      {"model", b.spec.model},
      {"limits",
       {{"max_steps", b.spec.limits.max_steps},
        {"max_tokens", b.spec.limits.max_tokens},
        {"max_wall_s", b.spec.limits.max_wall_s}}},
      {"priority", b.spec.priority},
      {"task_key", b.task_key},
      {"status", to_string(b.status)},
      {"outcome", b.outcome ? nlohmann::json(to_string(*b.outcome)) : nlohmann::json(nullptr)},
      {"attempt", b.attempt},
      {"lease_owner", opt(b.lease_owner)},
      {"lease_expires_ms", opt(b.lease_expires_ms)},
      {"cancel_requested", b.cancel_requested},
      {"created_ms", b.created_ms},
      {"started_ms", opt(b.started_ms)},
      {"finished_ms", opt(b.finished_ms)},
      {"result_branch", opt(b.result_branch)},
      {"error_message", opt(b.error_message)},
      {"metrics", metrics_json(b.metrics)},
  };
  if (b.result_diff) j["result_diff"] = *b.result_diff;
  return j.dump();
}

std::string to_json(const Event& e) {
  nlohmann::json payload = nlohmann::json::parse(e.payload_json, nullptr, /*allow_exceptions=*/false);
  if (payload.is_discarded()) payload = e.payload_json;  // stored payloads are validated; be safe
  return nlohmann::json{{"build_id", e.build_id}, {"seq", e.seq},   {"attempt", e.attempt},
                        {"ts_ms", e.ts_ms},       {"kind", e.kind}, {"payload", payload}}
      .dump();
}

std::string to_json(const StoreStats& s) {
  nlohmann::json by_status = nlohmann::json::object();
  for (const auto& [status, count] : s.builds_by_status) by_status[std::string(to_string(status))] = count;
  return nlohmann::json{{"builds_by_status", by_status},          {"queue_depth", s.queue_depth},
                        {"tokens_prefilled", s.tokens_prefilled}, {"tokens_cached", s.tokens_cached},
                        {"tokens_generated", s.tokens_generated}, {"tokens_reasoning", s.tokens_reasoning}}
      .dump();
}

std::string to_json(const CompareReport& r) {
  nlohmann::json models = nlohmann::json::array();
  for (const ModelStats& m : r.models) {
    models.push_back({{"model", m.model},
                      {"builds", m.builds},
                      {"succeeded", m.succeeded},
                      {"success_rate", opt(m.success_rate)},
                      {"median_wall_s", opt(m.median_wall_s)},
                      {"p90_wall_s", opt(m.p90_wall_s)},
                      {"median_tokens_generated", opt(m.median_tokens_generated)},
                      {"decode_tokens_per_s", opt(m.decode_tokens_per_s)}});
  }
  nlohmann::json pairs = nlohmann::json::array();
  for (const PairStats& p : r.pairs) {
    pairs.push_back({{"model_a", p.model_a},
                     {"model_b", p.model_b},
                     {"tasks", p.tasks},
                     {"both_succeeded", p.both_succeeded},
                     {"only_a", p.only_a},
                     {"only_b", p.only_b},
                     {"both_failed", p.both_failed},
                     {"mcnemar_p", p.mcnemar_p},
                     {"median_wall_ratio", opt(p.median_wall_ratio)}});
  }
  return nlohmann::json{{"models", models}, {"pairs", pairs}}.dump();
}

}  // namespace kiln::store
