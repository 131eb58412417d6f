// Parsing and schema-typing of one complete tool call body (the text between <tool_call> and
// </tool_call>, or a bare <function=…>…</function>). Internal to the tool-call parser.
#pragma once

#include <string_view>
#include <vector>

#include "engine/chat/tool_call_parser.h"

namespace kiln::engine {

struct CallParse {
  ParsedToolCall call;
  std::vector<ParseError> errors;  // empty when the call is usable
};

CallParse parse_tool_call_body(std::string_view body, const std::vector<Json>& tools,
                               std::size_t call_index);

// Converts one XML parameter value (already stripped of its framing newlines) to the type the
// property schema asks for. Returns false and sets `why` when it does not fit.
bool convert_parameter(std::string_view text, const Json& property_schema, Json& out,
                       std::string& why);

}  // namespace kiln::engine
