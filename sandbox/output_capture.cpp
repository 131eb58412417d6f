#include "sandbox/output_capture.h"

#include <algorithm>

namespace kiln::sandbox {

OutputCapture::OutputCapture(std::size_t head_bytes, std::size_t tail_bytes)
    : head_cap_(head_bytes), tail_cap_(tail_bytes) {}

void OutputCapture::append(std::string_view chunk) {
  total_ += chunk.size();
  std::size_t to_head = std::min(chunk.size(), head_cap_ - head_.size());
  head_.append(chunk.data(), to_head);
  chunk.remove_prefix(to_head);
  if (chunk.empty() || tail_cap_ == 0) return;
  if (chunk.size() >= tail_cap_) {  // the chunk alone fills the tail
    ring_.assign(chunk.substr(chunk.size() - tail_cap_));
    ring_pos_ = 0;
    return;
  }
  if (ring_.size() < tail_cap_) {  // still filling the ring linearly
    std::size_t fill = std::min(chunk.size(), tail_cap_ - ring_.size());
    ring_.append(chunk.data(), fill);
    chunk.remove_prefix(fill);
    ring_pos_ = 0;
  }
  while (!chunk.empty()) {  // overwrite the oldest bytes, at most two copies
    std::size_t n = std::min(chunk.size(), tail_cap_ - ring_pos_);
    ring_.replace(ring_pos_, n, chunk.data(), n);
    chunk.remove_prefix(n);
    ring_pos_ = (ring_pos_ + n) % tail_cap_;
  }
}

std::uint64_t OutputCapture::dropped_bytes() const { return total_ - head_.size() - ring_.size(); }

std::string OutputCapture::tail() const {
  if (ring_.size() < tail_cap_ || ring_pos_ == 0) return ring_;
  return ring_.substr(ring_pos_) + ring_.substr(0, ring_pos_);
}

std::string join_with_marker(std::string_view head, std::string_view tail, std::uint64_t dropped) {
  std::string out(head);
  if (dropped > 0) {
    if (!out.empty() && out.back() != '\n') out += '\n';
    out += "[... " + std::to_string(dropped) + " bytes of output dropped ...]\n";
  }
  out += tail;
  return out;
}

}  // namespace kiln::sandbox
