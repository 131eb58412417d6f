// Bounded capture of a command's output: the first `head` bytes, the last `tail` bytes, and a
// count of what fell between. Memory stays at head + tail however much the command prints.
// Owned by the thread running the command; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::sandbox {

class OutputCapture {
 public:
  OutputCapture(std::size_t head_bytes, std::size_t tail_bytes);

  void append(std::string_view chunk);

  std::uint64_t total_bytes() const { return total_; }
  std::uint64_t dropped_bytes() const;
  const std::string& head() const { return head_; }
  std::string tail() const;  // the kept tail, in order (empty until the head is full)

 private:
  std::size_t head_cap_;
  std::size_t tail_cap_;
  std::string head_;
  std::string ring_;         // circular buffer of the tail; grows up to tail_cap_
  std::size_t ring_pos_ = 0; // next write position once the ring is full
  std::uint64_t total_ = 0;
};

// Head, a one-line marker naming how many bytes were left out, then tail.
std::string join_with_marker(std::string_view head, std::string_view tail, std::uint64_t dropped);

}  // namespace kiln::sandbox
