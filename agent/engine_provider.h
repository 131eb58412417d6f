// engine_model_provider: the ModelProvider `kiln serve` hands to its WorkerPool. Maps a build's
// model name to a loaded engine model and its tokenizer, and opens one EngineChatModel (one
// engine session) per build. An unknown name or a full session table is a model_error for that
// build, with a message naming the model. The entries' models and tokenizers must outlive the
// provider and every build it served (the server owns them).
#pragma once

#include <map>
#include <string>

#include "agent/engine_chat_model.h"
#include "agent/worker.h"

namespace kiln::agent {

struct EngineModelEntry {
  engine::Model* model = nullptr;
  const engine::Tokenizer* tokenizer = nullptr;
  EngineChatModelOptions options;
};

ModelProvider engine_model_provider(std::map<std::string, EngineModelEntry> models);

}  // namespace kiln::agent
