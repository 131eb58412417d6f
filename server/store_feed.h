// The EventHub's view of the store: events after a seq, plus whether the build is finished.
#pragma once

#include "server/event_hub.h"

namespace kiln::store {
class Store;
}

namespace kiln::server {

class StoreFeed : public EventFeed {
 public:
  explicit StoreFeed(store::Store& store) : store_(store) {}
  // Reads the build's status *before* its events, so "terminal" means every event is in the page
  // (or a later one): the store appends a build's last event in the transaction that ends it.
  std::optional<std::string> read(const std::string& build_id, int64_t after, int limit, FeedPage& page) override;

 private:
  store::Store& store_;
};

}  // namespace kiln::server
