#include "actors/front_end/tool_request.hpp"

#include <algorithm>
#include <vector>

#include "model/chat/chat_template.hpp"

namespace mqlm::actors::front_end {

using messages::ToolChoice;
using nlohmann::json;

namespace {

using Check = std::optional<ToolProblem>;

ToolProblem wrong(const std::string& field, std::string_view expected, const json& value) {
  return {field, "'" + field + "' must be " + std::string(expected) + ", not " + std::string(json_type_name(value))};
}

ToolProblem problem(const std::string& field, const std::string& what) { return {field, "'" + field + "' " + what}; }

// Nesting beyond `levels` below `value`, found without recursing deeper than that.
bool nests_deeper_than(const json& value, std::size_t levels) {
  if (!value.is_structured()) return false;
  if (levels == 0) return true;
  return std::any_of(value.begin(), value.end(), [&](const json& item) { return nests_deeper_than(item, levels - 1); });
}

// `value` as JSON text of at most max_bytes, its nesting checked first.
Check json_text(const json& value, const std::string& field, std::size_t max_bytes, std::string& text) {
  if (nests_deeper_than(value, kMaxToolNesting)) {
    return problem(field, "nests deeper than " + std::to_string(kMaxToolNesting) + " levels");
  }
  try {
    text = value.empty() ? "" : value.dump();
  } catch (const json::type_error&) {  // a string that is not UTF-8 (msgpack carries any bytes)
    return problem(field, "holds a string that is not UTF-8 text");
  }
  if (text.size() > max_bytes) {
    return problem(field, "is " + std::to_string(text.size()) + " bytes of JSON: at most " +
                              std::to_string(max_bytes) + " are accepted");
  }
  return std::nullopt;
}

std::string quoted_name(std::string_view name) { return "\"" + std::string(name.substr(0, kMaxToolNameBytes)) + "\""; }

Check check_tool_name(const json& name, const std::string& field) {
  if (!name.is_string()) return wrong(field, "a string", name);
  const auto& text = name.get_ref<const std::string&>();
  if (!is_tool_name(text)) {
    return problem(field, "is " + quoted_name(text) + ": a function's name is 1 to 64 letters, digits, '_' or '-'");
  }
  return std::nullopt;
}

// One {"type": "function", "function": {name, description?, parameters?}}; its name into `names`.
Check read_tool(const json& tool, const std::string& field, std::vector<std::string>& names) {
  if (!tool.is_object()) return wrong(field, R"(an object {"type": "function", "function": {...}})", tool);
  const auto type = tool.find("type");
  if (type == tool.end() || *type != "function") {
    return problem(field + ".type", "must be \"function\": functions are the tools this server calls");
  }
  const auto function = tool.find("function");
  if (function == tool.end()) return problem(field + ".function", "is missing");
  if (!function->is_object()) return wrong(field + ".function", "an object with a name", *function);
  const auto name = function->find("name");
  if (name == function->end()) return problem(field + ".function.name", "is missing");
  if (auto failure = check_tool_name(*name, field + ".function.name")) return failure;
  if (auto description = function->find("description");
      description != function->end() && !description->is_string() && !description->is_null()) {
    return wrong(field + ".function.description", "a string", *description);
  }
  if (auto parameters = function->find("parameters");
      parameters != function->end() && !parameters->is_object() && !parameters->is_null()) {
    return wrong(field + ".function.parameters", "an object (a JSON schema)", *parameters);
  }
  const auto& text = name->get_ref<const std::string&>();
  if (std::find(names.begin(), names.end(), text) != names.end()) {
    return problem(field + ".function.name", "is " + quoted_name(text) + ", the name of an earlier tool: names are unique");
  }
  names.push_back(text);
  return std::nullopt;
}

// The names of the tools Submit::tools holds (checked when the request was read).
std::vector<std::string> tool_names(const std::string& tools_text) {
  std::vector<std::string> names;
  const json tools = json::parse(tools_text, nullptr, false);
  if (!tools.is_array()) return names;
  for (const auto& tool : tools) {
    if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
        tool["function"].contains("name") && tool["function"]["name"].is_string()) {
      names.push_back(tool["function"]["name"].get<std::string>());
    }
  }
  return names;
}

}  // namespace

bool is_tool_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxToolNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::string_view json_type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unknown type";
  }
}

std::optional<ToolProblem> read_tools(const json& tools, const std::string& field, std::string& text) {
  text.clear();
  if (!tools.is_array()) return wrong(field, "an array of tools", tools);
  if (tools.size() > kMaxTools) {
    return problem(field, "has " + std::to_string(tools.size()) + " tools: at most " + std::to_string(kMaxTools) +
                              " are accepted");
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    if (auto failure = read_tool(tools[i], field + "[" + std::to_string(i) + "]", names)) return failure;
  }
  return json_text(tools, field, kMaxToolsBytes, text);
}

std::optional<ToolProblem> read_tool_choice_mode(std::string_view mode, messages::Submit& submit) {
  if (mode == "auto" || mode == "none" || mode == "required") {
    submit.tool_choice = static_cast<std::uint8_t>(mode == "auto"   ? ToolChoice::automatic
                                                   : mode == "none" ? ToolChoice::none
                                                                    : ToolChoice::required);
    submit.tool_choice_name.clear();
    return std::nullopt;
  }
  return problem("tool_choice", "is \"" + std::string(mode.substr(0, kMaxToolNameBytes)) +
                                    R"(": it must be "auto", "none", "required" or {"type": "function", )"
                                    R"("function": {"name": NAME}})");
}

std::optional<ToolProblem> read_template_kwargs(const json& kwargs, std::string& text) {
  text.clear();
  const std::string field = "chat_template_kwargs";
  if (!kwargs.is_object()) return wrong(field, "an object", kwargs);
  for (const auto& [key, value] : kwargs.items()) {
    if (model::is_reserved_template_variable(key)) {
      return problem(field + "." + key, "is set by the server: chat_template_kwargs may not replace it");
    }
  }
  return json_text(kwargs, field, kMaxTemplateKwargsBytes, text);
}

std::optional<ToolProblem> check_turn_tools(const messages::ChatTurn& turn, const std::string& field) {
  const bool assistant = turn.role == "assistant";
  if (turn.role == "tool" && turn.tool_call_id.empty()) {
    return problem(field + ".tool_call_id", "is missing: a tool message names the call it answers");
  }
  if (!turn.has_content && !assistant) {
    return problem(field + ".content", "is null or missing: only an assistant message may have no content");
  }
  if (turn.tool_calls.empty()) return std::nullopt;
  if (!assistant) return problem(field + ".tool_calls", "is on a \"" + turn.role + "\" message: only assistants call tools");
  if (turn.tool_calls.size() > kMaxToolCallsPerTurn) {
    return problem(field + ".tool_calls", "has " + std::to_string(turn.tool_calls.size()) + " calls: at most " +
                                              std::to_string(kMaxToolCallsPerTurn) + " are accepted");
  }
  for (std::size_t i = 0; i < turn.tool_calls.size(); ++i) {
    const messages::ToolCall& call = turn.tool_calls[i];
    const std::string call_field = field + ".tool_calls[" + std::to_string(i) + "]";
    if (call.id.empty()) return problem(call_field + ".id", "is missing or empty: a tool call has an id");
    if (!is_tool_name(call.name)) {
      return problem(call_field + ".function.name",
                     "is " + quoted_name(call.name) + ": a function's name is 1 to 64 letters, digits, '_' or '-'");
    }
  }
  return std::nullopt;
}

std::optional<ToolProblem> check_tool_choice(const messages::Submit& submit) {
  const auto choice = static_cast<ToolChoice>(submit.tool_choice);
  if (choice != ToolChoice::required && choice != ToolChoice::function) return std::nullopt;
  if (submit.tools.empty()) {
    return problem("tool_choice", std::string("is ") + (choice == ToolChoice::required ? "\"required\"" : "a function") +
                                      ": give the tools in 'tools'");
  }
  if (choice == ToolChoice::function) {
    const auto names = tool_names(submit.tools);
    if (std::find(names.begin(), names.end(), submit.tool_choice_name) == names.end()) {
      return problem("tool_choice.function.name",
                     "is " + quoted_name(submit.tool_choice_name) + ", which is not among the functions in 'tools'");
    }
  }
  return std::nullopt;
}

}  // namespace mqlm::actors::front_end
