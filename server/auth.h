// Bearer-token authentication. Loopback listeners need no token; any other listener must have
// one (the server refuses to start otherwise) and every API request must carry
// `Authorization: Bearer <token>`, compared in constant time.
#pragma once

#include <string>
#include <string_view>

namespace kiln::server {

// Compares without an early exit on the first differing byte (length differences still show).
bool constant_time_equals(std::string_view a, std::string_view b);

// True when `authorization_header` is "Bearer <token>" with the right token, or token is empty.
bool bearer_allows(const std::string& token, std::string_view authorization_header);

// Non-empty error when the combination of listen host and token is unsafe (non-loopback, no token).
std::string check_listen_auth(const std::string& host, const std::string& token);

}  // namespace kiln::server
