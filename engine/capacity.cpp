#include "engine/capacity.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

namespace kiln::engine {

CapacityPlan plan_capacity(const ModelConfig& c, int64_t budget_bytes, int max_sessions, CacheDtype dtype,
                           int64_t page_tokens, int draft_tokens) {
  CapacityPlan p;
  p.budget_bytes = budget_bytes;
  p.max_sessions = max_sessions;
  p.dtype = dtype;
  KvLayout layout{c.n_full_layers(), c.kv_dim(), dtype, page_tokens};
  p.kv_bytes_per_token = layout.bytes_per_token();
  const int64_t conv = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_dim() * int64_t(cache_dtype_size(dtype));
  const int64_t recurrent = int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  p.state_bytes_per_session = int64_t(c.n_linear_layers()) * (conv + recurrent);
  p.draft_tokens = std::max(draft_tokens, 0);
  if (p.draft_tokens > 0) {
    // The step's logits twice: the session's own rows, and forward_batch's gathered copy of
    // every session's rows (one lm_head product for the whole batch writes them side by side).
    p.speculative_bytes_per_session = p.state_bytes_per_session +
                                      int64_t(p.draft_tokens) * c.n_linear_layers() * c.gdn_input_floats() * 4 +
                                      2 * int64_t(p.draft_tokens + 1) * c.vocab_size * 4;
  }
  p.page_tokens = page_tokens;
  p.page_bytes = layout.page_bytes();
  const int64_t for_kv =
      budget_bytes - int64_t(max_sessions) * (p.state_bytes_per_session + p.speculative_bytes_per_session);
  p.pages = (for_kv > 0 && p.page_bytes > 0) ? for_kv / p.page_bytes : 0;
  p.kv_tokens = p.pages * page_tokens;
  p.max_position_embeddings = c.max_position_embeddings;
  const int64_t pages_per_full = (c.max_position_embeddings + page_tokens - 1) / page_tokens;
  p.full_length_sessions = pages_per_full > 0 ? p.pages / pages_per_full : 0;
  return p;
}

std::string CapacityPlan::to_text() const {
  std::ostringstream os;
  const double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
  os << "kv budget: " << budget_bytes << " bytes (" << budget_bytes / gib << " GiB), max sessions " << max_sessions
     << ", cache dtype " << cache_dtype_name(dtype) << "\n"
     << "kv bytes per token: " << kv_bytes_per_token << "\n"
     << "fixed state bytes per session: " << state_bytes_per_session << " (" << state_bytes_per_session / mib
     << " MiB)\n";
  if (draft_tokens > 0)
    os << "speculative scratch bytes per session (drafts of " << draft_tokens << "): " << speculative_bytes_per_session
       << " (" << speculative_bytes_per_session / mib << " MiB)\n";
  os << "page: " << page_tokens << " tokens, " << page_bytes << " bytes; pages: " << pages << "\n"
     << "kv capacity: " << kv_tokens << " tokens\n"
     << "full-length sessions (" << max_position_embeddings << " tokens): " << full_length_sessions << "\n";
  return os.str();
}

int64_t kv_budget_for(const ModelConfig& c, int max_sessions, CacheDtype dtype, int64_t tokens_per_session,
                      int64_t page_tokens, int draft_tokens) {
  const CapacityPlan unit = plan_capacity(c, 0, 1, dtype, page_tokens, draft_tokens);
  const int64_t pages = (std::max<int64_t>(tokens_per_session, 0) + page_tokens - 1) / page_tokens;
  const int64_t kv = unit.kv_bytes_per_token > 0 ? pages * unit.page_bytes : 0;  // no full-attention layer: none
  return int64_t(std::max(max_sessions, 1)) * (unit.state_bytes_per_session + unit.speculative_bytes_per_session + kv);
}

namespace {

// The first line of `path` as a byte count; 0 when absent, "max", or not a number.
int64_t read_limit_file(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
  return ec == std::errc() && v > 0 ? v : 0;
}

}  // namespace

int64_t usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t usable = pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
  // A cgroup v1 "no limit" is a huge number (PAGE_COUNTER_MAX pages): min() ignores it.
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t v = read_limit_file(limit);
    if (v > 0 && (usable == 0 || v < usable)) usable = v;
  }
  return usable;
}

int64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return -1;
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, v);
  if (ec != std::errc() || ptr != text.data() + i) return -1;
  std::string unit = text.substr(i);
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  static const std::pair<const char*, double> units[] = {
      {"", 1},       {"b", 1},         {"kib", 0x1p10}, {"k", 0x1p10}, {"mib", 0x1p20}, {"m", 0x1p20},
      {"gib", 0x1p30}, {"g", 0x1p30},  {"tib", 0x1p40}, {"t", 0x1p40}, {"kb", 1e3},     {"mb", 1e6},
      {"gb", 1e9},   {"tb", 1e12}};
  for (const auto& [name, factor] : units) {
    if (unit != name) continue;
    const double bytes = v * factor;
    // !(bytes >= 1) also refuses NaN; 2^63 and more do not fit in the result.
    if (!(bytes >= 1) || !(bytes < 0x1p63)) return -1;
    return int64_t(bytes);
  }
  return -1;
}

}  // namespace kiln::engine
