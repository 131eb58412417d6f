// engine_model_provider: the ModelProvider `kiln serve` hands to its WorkerPool. Maps a build's
// model name to a loaded engine model and its tokenizer, and opens one EngineChatModel (one
// engine session) per build. When every session slot of the model is taken the build waits in
// the engine's line (engine::Model::open_session_waiting), ahead of builds of lower priority;
// with a store, it takes the build's priority from it and emits a `status` event
// {"phase": "waiting_for_engine", "model", "position", "max_sessions"} each time its place in
// line changes, and leaves the line when the build is cancelled or its lease is lost. (A first
// prompt refused for KV memory waits inside the turn: see TurnDelta::waiting_for_memory.)
// An unknown name is a model_error for that build, with a message naming the model. The
// entries' models and tokenizers (and the store) must outlive the provider and every build it
// served (the server owns them).
#pragma once

#include <map>
#include <string>

#include "agent/engine_chat_model.h"
#include "agent/worker.h"

namespace kiln::store {
class Store;
}

namespace kiln::agent {

struct EngineModelEntry {
  engine::Model* model = nullptr;
  const engine::Tokenizer* tokenizer = nullptr;
  EngineChatModelOptions options;
};

ModelProvider engine_model_provider(std::map<std::string, EngineModelEntry> models, store::Store* store = nullptr);

}  // namespace kiln::agent
