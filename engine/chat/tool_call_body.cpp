#include "engine/chat/tool_call_body.h"

#include <charconv>
#include <set>

#include "engine/chat/python_text.h"

namespace kiln::engine {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string shorten(std::string_view s, std::size_t max = 60) {
  std::string out(s.substr(0, max));
  if (s.size() > max) out += "…";
  return out;
}

const Json* find_tool(const std::vector<Json>& tools, const std::string& name) {
  for (const Json& t : tools) {
    const Json& f = t.contains("function") && t["function"].is_object() ? t["function"] : t;
    if (f.contains("name") && f["name"].is_string() && f["name"].get<std::string>() == name)
      return &f;
  }
  return nullptr;
}

std::string tool_names(const std::vector<Json>& tools) {
  std::string out;
  for (const Json& t : tools) {
    const Json& f = t.contains("function") && t["function"].is_object() ? t["function"] : t;
    if (!f.contains("name") || !f["name"].is_string()) continue;
    if (!out.empty()) out += ", ";
    out += f["name"].get<std::string>();
  }
  return out;
}

// The JSON-schema types a property accepts, from "type" (string or list), or anyOf/oneOf.
std::vector<std::string> schema_types(const Json& s) {
  std::vector<std::string> types;
  if (!s.is_object()) return types;
  if (s.contains("type")) {
    if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
    else if (s["type"].is_array())
      for (const Json& t : s["type"])
        if (t.is_string()) types.push_back(t.get<std::string>());
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key) && s[key].is_array())
      for (const Json& sub : s[key])
        for (const std::string& t : schema_types(sub)) types.push_back(t);
  if (types.empty() && s.contains("enum") && s["enum"].is_array())
    for (const Json& v : s["enum"]) {
      if (v.is_string()) types.push_back("string");
      else if (v.is_number_integer()) types.push_back("integer");
      else if (v.is_number()) types.push_back("number");
      else if (v.is_boolean()) types.push_back("boolean");
    }
  return types;
}

bool has(const std::vector<std::string>& v, std::string_view x) {
  for (const auto& s : v)
    if (s == x) return true;
  return false;
}

bool json_type_fits(const Json& v, const std::vector<std::string>& types) {
  if (types.empty()) return true;
  for (const std::string& t : types) {
    if ((t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
        (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
        (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
        (t == "null" && v.is_null()))
      return true;
    if (t == "integer" && v.is_number_float()) {
      const double d = v.get<double>();
      if (d == static_cast<double>(static_cast<long long>(d))) return true;
    }
  }
  return false;
}

std::string join_types(const std::vector<std::string>& types) {
  std::string out;
  for (const auto& t : types) out += (out.empty() ? "" : " or ") + t;
  return out;
}

// Checks a typed value against the property's enum, if any.
bool check_enum(const Json& value, const Json& schema, std::string& why) {
  if (!schema.is_object() || !schema.contains("enum") || !schema["enum"].is_array()) return true;
  for (const Json& allowed : schema["enum"])
    if (allowed == value) return true;
  why = "must be one of " + python::dumps(schema["enum"]) + ", got " + shorten(python::dumps(value));
  return false;
}

}  // namespace

bool convert_parameter(std::string_view text, const Json& schema, Json& out, std::string& why) {
  const std::vector<std::string> types = schema_types(schema);
  const std::string_view t = trim_ws(text);
  if (types.empty()) {
    // Untyped: JSON if it parses, else the raw string.
    Json parsed = Json::parse(t, nullptr, false);
    out = parsed.is_discarded() || t.empty() ? Json(std::string(text)) : parsed;
    return check_enum(out, schema, why);
  }
  for (const std::string& type : types) {
    if (type == "null" && (t == "null" || t == "None")) {
      out = nullptr;
      return true;
    }
    if (type == "boolean") {
      if (t == "true" || t == "True") out = true;
      else if (t == "false" || t == "False") out = false;
      else continue;
      return check_enum(out, schema, why);
    }
    if (type == "integer") {
      long long v = 0;
      const char* b = t.data();
      const char* e = t.data() + t.size();
      if (!t.empty() && *b == '+') ++b;
      auto [ptr, ec] = std::from_chars(b, e, v);
      if (ec == std::errc() && ptr == e && b != e) {
        out = v;
        return check_enum(out, schema, why);
      }
      continue;
    }
    if (type == "number" || type == "object" || type == "array") {
      Json parsed = Json::parse(t, nullptr, false);
      if (parsed.is_discarded()) continue;
      if ((type == "number" && parsed.is_number()) || (type == "object" && parsed.is_object()) ||
          (type == "array" && parsed.is_array())) {
        out = std::move(parsed);
        return check_enum(out, schema, why);
      }
    }
  }
  if (has(types, "string")) {
    out = std::string(text);
    return check_enum(out, schema, why);
  }
  why = "expects " + join_types(types) + ", got " + shorten(python::dumps(Json(std::string(t))));
  if (has(types, "object") || has(types, "array")) why += " (not valid JSON of that type)";
  return false;
}

namespace {

struct RawParam {
  std::string name;
  std::string value;    // XML form: text; JSON form: unused
  Json json_value;      // JSON form
  bool is_json = false;
};

// Splits the XML body into name + parameters; returns false with errors filled on bad structure.
bool parse_xml(std::string_view body, std::string& name, std::vector<RawParam>& params,
               std::vector<ParseError>& errors, std::size_t index) {
  const std::string prefix = "tool call #" + std::to_string(index + 1);
  auto fail = [&](ParseErrorKind kind, std::string msg, std::string param = "") {
    errors.push_back({kind, prefix + (name.empty() ? "" : " (" + name + ")") + ": " + msg, name,
                      std::move(param), index});
    return false;
  };
  std::string_view s = trim_ws(body);
  if (s.substr(0, 10) != "<function=")
    return fail(ParseErrorKind::malformed,
                "expected <function=NAME> after <tool_call>, got \"" + shorten(s) + "\"");
  const std::size_t gt = s.find('>');
  const std::size_t nl = s.find('\n');
  if (gt == std::string_view::npos || (nl != std::string_view::npos && nl < gt))
    return fail(ParseErrorKind::malformed, "the <function=NAME> tag is not closed with '>'");
  name = std::string(trim_ws(s.substr(10, gt - 10)));
  if (name.empty()) return fail(ParseErrorKind::malformed, "empty function name in <function=>");
  s.remove_prefix(gt + 1);
  while (true) {
    s = trim_ws(s);
    if (s.empty())
      return fail(ParseErrorKind::unclosed_tag, "unclosed <function=" + name + ">: missing </function>");
    if (s.substr(0, 11) == "</function>") {
      const std::string_view rest = trim_ws(s.substr(11));
      if (!rest.empty())
        return fail(ParseErrorKind::malformed,
                    "unexpected text after </function>: \"" + shorten(rest) + "\"");
      return true;
    }
    if (s.substr(0, 11) != "<parameter=")
      return fail(ParseErrorKind::malformed,
                  "expected <parameter=NAME> or </function>, got \"" + shorten(s) + "\"");
    const std::size_t pgt = s.find('>');
    const std::size_t pnl = s.find('\n');
    if (pgt == std::string_view::npos || (pnl != std::string_view::npos && pnl < pgt))
      return fail(ParseErrorKind::malformed, "a <parameter=NAME> tag is not closed with '>'");
    RawParam p;
    p.name = std::string(trim_ws(s.substr(11, pgt - 11)));
    s.remove_prefix(pgt + 1);
    // The value ends at the first </parameter> followed (after whitespace) by another parameter,
    // </function> or the end: values may contain the closing tag text themselves.
    std::size_t close = std::string_view::npos;
    for (std::size_t from = 0;;) {
      const std::size_t c = s.find("</parameter>", from);
      if (c == std::string_view::npos) break;
      const std::string_view after = trim_ws(s.substr(c + 12));
      if (after.empty() || after.substr(0, 11) == "<parameter=" || after.substr(0, 11) == "</function>") {
        close = c;
        break;
      }
      from = c + 1;
    }
    // No well-placed close: take the first one, so stray text after it is reported.
    if (close == std::string_view::npos) close = s.find("</parameter>");
    if (close == std::string_view::npos)
      return fail(ParseErrorKind::unclosed_tag,
                  "unclosed <parameter=" + p.name + ">: missing </parameter>", p.name);
    std::string_view value = s.substr(0, close);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    p.value = std::string(value);
    params.push_back(std::move(p));
    s.remove_prefix(close + 12);
  }
}

bool parse_json_form(std::string_view body, std::string& name, std::vector<RawParam>& params,
                     std::vector<ParseError>& errors, std::size_t index) {
  const std::string prefix = "tool call #" + std::to_string(index + 1);
  auto fail = [&](std::string msg) {
    errors.push_back({ParseErrorKind::malformed, prefix + ": " + msg, name, "", index});
    return false;
  };
  Json j = Json::parse(trim_ws(body), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return fail("the JSON inside <tool_call> does not parse as an object");
  if (!j.contains("name") || !j["name"].is_string()) return fail("JSON tool call has no \"name\" string");
  name = j["name"].get<std::string>();
  Json args = j.contains("arguments") ? j["arguments"]
              : j.contains("parameters") ? j["parameters"] : Json::object();
  if (args.is_string()) args = Json::parse(args.get<std::string>(), nullptr, false);
  if (args.is_null()) args = Json::object();
  if (args.is_discarded() || !args.is_object())
    return fail("\"arguments\" of " + name + " must be a JSON object");
  for (auto it = args.begin(); it != args.end(); ++it) {
    RawParam p;
    p.name = it.key();
    p.json_value = it.value();
    p.is_json = true;
    params.push_back(std::move(p));
  }
  return true;
}

}  // namespace

CallParse parse_tool_call_body(std::string_view body, const std::vector<Json>& tools,
                               std::size_t index) {
  CallParse r;
  r.call.call_index = index;
  std::vector<RawParam> params;
  std::string name;
  const std::string_view t = trim_ws(body);
  const bool ok = !t.empty() && t.front() == '{' ? parse_json_form(t, name, params, r.errors, index)
                                                : parse_xml(t, name, params, r.errors, index);
  if (!ok) return r;
  r.call.name = name;
  const std::string prefix = "tool call #" + std::to_string(index + 1) + " (" + name + "): ";
  auto error = [&](ParseErrorKind kind, std::string msg, std::string param = "") {
    r.errors.push_back({kind, prefix + msg, name, std::move(param), index});
  };

  const Json* tool = tools.empty() ? nullptr : find_tool(tools, name);
  if (!tools.empty() && !tool) {
    error(ParseErrorKind::unknown_function,
          "unknown function '" + name + "'; available: " + tool_names(tools));
    return r;
  }
  const Json* schema = tool && tool->contains("parameters") ? &(*tool)["parameters"] : nullptr;
  const Json* props = schema && schema->contains("properties") && (*schema)["properties"].is_object()
                          ? &(*schema)["properties"] : nullptr;
  const bool additional = schema && schema->contains("additionalProperties") &&
                          (*schema)["additionalProperties"] != false;
  std::set<std::string> seen;
  for (RawParam& p : params) {
    if (!seen.insert(p.name).second) {
      error(ParseErrorKind::duplicate_parameter, "parameter '" + p.name + "' is given twice", p.name);
      continue;
    }
    const Json* prop = props && props->contains(p.name) ? &(*props)[p.name] : nullptr;
    if (props && !prop && !additional) {
      std::string known;
      for (auto it = props->begin(); it != props->end(); ++it) known += (known.empty() ? "" : ", ") + it.key();
      error(ParseErrorKind::unknown_parameter,
            "unknown parameter '" + p.name + "'; parameters are: " + known, p.name);
      continue;
    }
    const Json empty = Json::object();
    const Json& ps = prop ? *prop : empty;
    Json value;
    std::string why;
    bool fits;
    if (!p.is_json) {
      fits = convert_parameter(p.value, ps, value, why);
    } else if (p.json_value.is_string() && !schema_types(ps).empty() &&
               !has(schema_types(ps), "string")) {
      fits = convert_parameter(p.json_value.get<std::string>(), ps, value, why);  // "5" for int
    } else {
      value = p.json_value;
      fits = json_type_fits(value, schema_types(ps));
      if (!fits) why = "expects " + join_types(schema_types(ps)) + ", got " + shorten(python::dumps(value));
      else fits = check_enum(value, ps, why);
    }
    if (!fits) {
      error(ParseErrorKind::wrong_type, "parameter '" + p.name + "' " + why, p.name);
      continue;
    }
    r.call.arguments[p.name] = std::move(value);
  }
  if (schema && schema->contains("required") && (*schema)["required"].is_array()) {
    std::string missing;
    for (const Json& req : (*schema)["required"])
      if (req.is_string() && !seen.count(req.get<std::string>()))
        missing += (missing.empty() ? "'" : ", '") + req.get<std::string>() + "'";
    if (!missing.empty())
      error(ParseErrorKind::missing_parameter, "missing required parameter " + missing);
  }
  return r;
}

}  // namespace kiln::engine
