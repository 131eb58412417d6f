#include "server/store_feed.h"

#include <nlohmann/json.hpp>

#include "store/store.h"

namespace kiln::server {

std::optional<std::string> StoreFeed::read(const std::string& build_id, int64_t after, int limit, FeedPage& page) {
  int64_t id = std::stoll(build_id);
  auto build = store_.get(id, /*include_diff=*/false);
  if (!build) return build.error().message;
  page.terminal = store::is_terminal(build->status);
  if (page.terminal) {
    nlohmann::json end = {{"status", store::to_string(build->status)}};
    end["reason"] = build->outcome ? nlohmann::json(store::to_string(*build->outcome)) : nlohmann::json(nullptr);
    if (build->error_message) end["error_message"] = *build->error_message;  // why it did not succeed
    page.end_json = end.dump();
  }
  auto events = store_.read_events(id, after, limit);
  if (!events) return events.error().message;
  page.events.clear();
  page.events.reserve(events->size());
  for (const store::Event& e : *events) page.events.push_back({e.seq, e.kind, store::to_json(e)});
  return std::nullopt;
}

}  // namespace kiln::server
