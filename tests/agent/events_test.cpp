#include "agent/events.h"

#include <gtest/gtest.h>

#include <thread>

namespace kiln::agent {
namespace {

TEST(TextBatcher, batches_streamed_text_into_few_events_in_order) {
  MemoryEventSink sink;
  {
    TextBatcher batcher(sink, std::chrono::milliseconds(50));
    for (int i = 0; i < 100; ++i) batcher.add("reasoning", "r");
    for (int i = 0; i < 100; ++i) batcher.add("model_text", "t");
  }  // destructor flushes
  auto events = sink.events();
  ASSERT_EQ(events.size(), 2u);  // 200 pieces within 50 ms: one event per kind
  EXPECT_EQ(events[0].kind, "reasoning");
  EXPECT_EQ(events[0].payload["text"], std::string(100, 'r'));
  EXPECT_EQ(events[1].kind, "model_text");
  EXPECT_EQ(events[1].payload["text"], std::string(100, 't'));
}

TEST(TextBatcher, flushes_at_the_interval_while_text_keeps_coming) {
  MemoryEventSink sink;
  TextBatcher batcher(sink, std::chrono::milliseconds(20));
  std::string all;
  for (int i = 0; i < 10; ++i) {
    batcher.add("model_text", std::to_string(i));
    all += std::to_string(i);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  batcher.flush();
  auto events = sink.events();
  EXPECT_GE(events.size(), 5u);  // the interval elapsed between pieces: text goes out live
  std::string joined;
  for (const auto& e : events) joined += e.payload["text"].get<std::string>();
  EXPECT_EQ(joined, all);
}

}  // namespace
}  // namespace kiln::agent
