#include "agent/engine_provider.h"

namespace kiln::agent {

ModelProvider engine_model_provider(std::map<std::string, EngineModelEntry> models) {
  return [models = std::move(models)](const std::string& name, int64_t) -> Result<std::unique_ptr<ChatModel>> {
    auto it = models.find(name);
    if (it == models.end()) {
      std::string known;
      for (const auto& [n, entry] : models) known += (known.empty() ? "" : ", ") + n;
      return Error{"no model named `" + name + "` is loaded (loaded: " + (known.empty() ? "none" : known) + ")"};
    }
    const EngineModelEntry& e = it->second;
    if (e.model == nullptr || e.tokenizer == nullptr) return Error{"model `" + name + "` has no engine or tokenizer"};
    auto opened = EngineChatModel::open(*e.model, *e.tokenizer, name, e.options);
    if (!opened) return Error{opened.error()};
    return std::unique_ptr<ChatModel>(std::move(opened.value()));
  };
}

}  // namespace kiln::agent
