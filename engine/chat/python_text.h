// The Python string/JSON behaviours the chat template depends on, reproduced byte for byte:
// str.strip() (Unicode whitespace), json.dumps(ensure_ascii=False) with ", " / ": " separators,
// and str() of JSON scalars (True, None, 1.5).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kiln::engine::python {

// Python's str.strip() with no argument: strips characters for which str.isspace() is true.
std::string_view strip(std::string_view s);
bool is_space(char32_t cp);

// json.dumps(value, ensure_ascii=False): keys in stored order, non-ASCII kept.
std::string dumps(const nlohmann::ordered_json& value);
void dumps_to(const nlohmann::ordered_json& value, std::string& out);

// str(value) for a scalar: "True"/"False", "None", integers, float repr; strings unchanged.
std::string str(const nlohmann::ordered_json& value);

}  // namespace kiln::engine::python
