#include "engine/capacity.h"

#include <cctype>
#include <sstream>

namespace kiln::engine {

CapacityPlan plan_capacity(const ModelConfig& c, int64_t budget_bytes, int max_sessions, CacheDtype dtype,
                           int64_t page_tokens) {
  CapacityPlan p;
  p.budget_bytes = budget_bytes;
  p.max_sessions = max_sessions;
  p.dtype = dtype;
  KvLayout layout{c.n_full_layers(), c.kv_dim(), dtype, page_tokens};
  p.kv_bytes_per_token = layout.bytes_per_token();
  const int64_t conv = int64_t(c.linear_conv_kernel_dim - 1) * c.conv_dim() * int64_t(cache_dtype_size(dtype));
  const int64_t recurrent = int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  p.state_bytes_per_session = int64_t(c.n_linear_layers()) * (conv + recurrent);
  p.page_tokens = page_tokens;
  p.page_bytes = layout.page_bytes();
  const int64_t for_kv = budget_bytes - int64_t(max_sessions) * p.state_bytes_per_session;
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
     << " MiB)\n"
     << "page: " << page_tokens << " tokens, " << page_bytes << " bytes; pages: " << pages << "\n"
     << "kv capacity: " << kv_tokens << " tokens\n"
     << "full-length sessions (" << max_position_embeddings << " tokens): " << full_length_sessions << "\n";
  return os.str();
}

int64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return -1;
  double v;
  try {
    v = std::stod(text.substr(0, i));
  } catch (...) {
    return -1;
  }
  std::string unit = text.substr(i);
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kib" || unit == "k") mult = 1024.0;
  else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return -1;
  return int64_t(v * mult);
}

}  // namespace kiln::engine
