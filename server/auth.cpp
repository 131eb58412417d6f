#include "server/auth.h"

#include "server/config.h"

namespace kiln::server {

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Walk the full length of the expected value whatever the input, so timing reveals only length.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

bool bearer_allows(const std::string& token, std::string_view header) {
  if (token.empty()) return true;
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() < prefix.size() || header.substr(0, prefix.size()) != prefix) return false;
  return constant_time_equals(header.substr(prefix.size()), token);
}

std::string check_listen_auth(const std::string& host, const std::string& token) {
  if (is_loopback_host(host) || !token.empty()) return {};
  return "refusing to listen on non-loopback address '" + host +
         "' without a token: pass --token or set KILN_TOKEN (clients then send "
         "'Authorization: Bearer <token>')";
}

}  // namespace kiln::server
