#include "agent/engine_provider.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>

#include "agent/store_events.h"
#include "store/store.h"

namespace kiln::agent {
namespace {

using Clock = std::chrono::steady_clock;

// What a waiting build needs from the store: its priority, its event log, and whether it was
// cancelled (read at most once a second while waiting).
struct BuildLine {
  int priority = 0;
  std::unique_ptr<StoreEventSink> events;
  bool fenced = false;
  Clock::time_point last_check{};
};

}  // namespace

ModelProvider engine_model_provider(std::map<std::string, EngineModelEntry> models, store::Store* store) {
  return [models = std::move(models), store](const std::string& name,
                                            int64_t build_id) -> Result<std::unique_ptr<ChatModel>> {
    auto it = models.find(name);
    if (it == models.end()) {
      std::string known;
      for (const auto& [n, entry] : models) known += (known.empty() ? "" : ", ") + n;
      return Error{"no model named `" + name + "` is loaded (loaded: " + (known.empty() ? "none" : known) + ")"};
    }
    const EngineModelEntry& e = it->second;
    if (e.model == nullptr || e.tokenizer == nullptr) return Error{"model `" + name + "` has no engine or tokenizer"};
    BuildLine line;
    if (store) {
      auto build = store->get(build_id, false);
      if (!build.ok()) return Error{"build " + std::to_string(build_id) + ": " + build.error().message};
      line.priority = int(std::clamp<int64_t>(build->spec.priority, INT_MIN, INT_MAX));
      line.events = std::make_unique<StoreEventSink>(*store, build_id, build->attempt);
    }
    engine::OpenOptions admission;
    admission.priority = line.priority;
    const int max_sessions = e.model->options().max_sessions;
    admission.on_wait = [&](int64_t position) {
      if (!line.events) return;
      Json status{{"phase", "waiting_for_engine"}, {"model", name}, {"position", position}, {"max_sessions", max_sessions}};
      if (!line.events->emit("status", status)) line.fenced = true;
    };
    admission.cancelled = [&] {
      if (line.fenced) return true;
      if (!store || Clock::now() - line.last_check < std::chrono::seconds(1)) return false;
      line.last_check = Clock::now();
      auto build = store->get(build_id, false);
      return build.ok() && build->cancel_requested;
    };
    auto opened = EngineChatModel::open(*e.model, *e.tokenizer, name, e.options, &admission);
    if (!opened) return Error{opened.error()};
    return std::unique_ptr<ChatModel>(std::move(opened.value()));
  };
}

}  // namespace kiln::agent
