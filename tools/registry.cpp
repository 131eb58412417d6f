// ToolRegistry: the list of tools for the prompt, and dispatch with argument checking.
#include <algorithm>
#include <exception>

#include "tools/tools.h"

namespace kiln::tools {

namespace {

bool has_type(const nlohmann::json& value, const std::string& type) {
  if (type == "string") return value.is_string();
  if (type == "integer") return value.is_number_integer();
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  if (type == "null") return value.is_null();
  return true;  // a schema keyword we do not check
}

std::string describe(const nlohmann::json& value) {
  if (value.is_string()) return "a string";
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_boolean()) return "a boolean";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

}  // namespace

std::string validate_args(const nlohmann::json& schema, const nlohmann::json& args) {
  if (!args.is_object()) return "arguments must be a JSON object, got " + describe(args);
  const nlohmann::json& props = schema.contains("properties") ? schema["properties"] : nlohmann::json::object();
  if (schema.contains("required")) {
    for (const auto& name : schema["required"]) {
      if (!args.contains(name.get<std::string>())) return "missing required argument '" + name.get<std::string>() + "'";
    }
  }
  for (const auto& [name, value] : args.items()) {
    if (!props.contains(name)) {
      std::string known;
      for (const auto& [k, v] : props.items()) known += (known.empty() ? "" : ", ") + k;
      return "unknown argument '" + name + "' (known: " + known + ")";
    }
    const auto& prop = props[name];
    if (!prop.contains("type")) continue;
    std::string type = prop["type"].get<std::string>();
    if (!has_type(value, type)) return "argument '" + name + "' must be " + (type == "integer" ? "an " : "a ") + type + ", got " + describe(value);
    if (type == "array" && prop.contains("items") && prop["items"].contains("type")) {
      std::string item_type = prop["items"]["type"].get<std::string>();
      for (const auto& item : value) {
        if (!has_type(item, item_type)) return "argument '" + name + "' must hold " + item_type + " items, got " + describe(item);
      }
      if (prop.contains("minItems") && value.size() < prop["minItems"].get<std::size_t>()) {
        return "argument '" + name + "' needs at least " + std::to_string(prop["minItems"].get<std::size_t>()) + " items";
      }
      if (prop.contains("maxItems") && value.size() > prop["maxItems"].get<std::size_t>()) {
        return "argument '" + name + "' takes at most " + std::to_string(prop["maxItems"].get<std::size_t>()) + " items";
      }
    }
  }
  return "";
}

void ToolRegistry::add(Tool tool) {
  auto it = std::find_if(tools_.begin(), tools_.end(), [&](const Tool& t) { return t.name == tool.name; });
  if (it != tools_.end()) {
    *it = std::move(tool);
  } else {
    tools_.push_back(std::move(tool));
  }
}

const Tool* ToolRegistry::find(std::string_view name) const {
  for (const auto& tool : tools_) {
    if (tool.name == name) return &tool;
  }
  return nullptr;
}

nlohmann::json ToolRegistry::prompt_schemas() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& tool : tools_) {
    out.push_back({{"type", "function"},
                   {"function", {{"name", tool.name}, {"description", tool.description}, {"parameters", tool.schema}}}});
  }
  return out;
}

ToolResult ToolRegistry::call(std::string_view name, const nlohmann::json& args, Context& ctx) const {
  const Tool* tool = find(name);
  if (tool == nullptr) {
    std::string known;
    for (const auto& t : tools_) known += (known.empty() ? "" : ", ") + t.name;
    return {"Error: unknown tool '" + std::string(name) + "'. Available tools: " + known + ".",
            {{"error", "unknown_tool"}, {"tool", name}}, true, false};
  }
  if (std::string e = validate_args(tool->schema, args); !e.empty()) {
    return {"Error: " + tool->name + ": " + e + ".", {{"error", "bad_arguments"}, {"tool", tool->name}, {"message", e}}, true, false};
  }
  try {
    return tool->run(args, ctx);
  } catch (const std::exception& e) {  // a tool bug must not take the build down
    return {"Error: " + tool->name + " failed internally: " + e.what(), {{"error", "internal"}, {"message", e.what()}}, true, false};
  }
}

ToolRegistry default_registry() {
  ToolRegistry registry;
  for (Tool (*make)() : {bash_tool, view_tool, create_tool, str_replace_tool, insert_tool, grep_tool, submit_tool}) {
    registry.add(make());
  }
  return registry;
}

}  // namespace kiln::tools
