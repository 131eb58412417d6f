// The out-of-the-box model: with no configured models, `kiln serve` generates a tiny random-weight
// model once under <var_dir>/models/demo (engine make_tiny) and serves it as "demo". Its output is
// noise; the log and /v1/models say so loudly.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

#include "server/config.h"

namespace kiln::server {

// Creates the demo model directory if it is missing (reuses it otherwise) and appends the "demo"
// model to config.models. The error names the directory.
std::optional<std::string> add_demo_model(ServerConfig& config, std::ostream& log);

}  // namespace kiln::server
