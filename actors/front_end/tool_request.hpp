// Tool calling as a request asks for it, whatever its protocol: the tools (OpenAI's shape), the
// tool_choice against them, the tool calls and tool results in a chat's turns, and the chat
// template's extra arguments. The http actor reads these from its JSON body and the gateway from
// its msgpack frame; both check them here, so one request is refused the same way by either,
// with the same field named.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "messages/serving.hpp"

namespace mqlm::actors::front_end {

// What the tools of one request may be. A tool's JSON (its parameters' schema) nests at most
// kMaxToolNesting levels: writing JSON out recurses once per level.
inline constexpr std::size_t kMaxTools = 128;
inline constexpr std::size_t kMaxToolNameBytes = 64;
inline constexpr std::size_t kMaxToolsBytes = 256 * 1024;  // the tools' JSON text, all together
inline constexpr std::size_t kMaxToolNesting = 32;
inline constexpr std::size_t kMaxToolCallsPerTurn = 128;
inline constexpr std::size_t kMaxToolCallIdBytes = 256;
inline constexpr std::size_t kMaxTemplateKwargsBytes = 64 * 1024;

// A field that is wrong: its path as the request spells it ("tools[1].function.name") and what
// was wrong, naming it.
struct ToolProblem {
  std::string field;
  std::string message;
};

// OpenAI's rule for function names: 1 to 64 of A-Z, a-z, 0-9, '_' and '-'.
bool is_tool_name(std::string_view name);

// "a string", "an object", ... for messages about a JSON value of the wrong type.
std::string_view json_type_name(const nlohmann::json& value);

// `tools`: an array of {"type": "function", "function": {"name", "description"?, "parameters"?}}
// (parameters a JSON-schema object), names unique; `field` names it in problems. text: the
// array's JSON text as Submit::tools carries it, "" for an empty array.
std::optional<ToolProblem> read_tools(const nlohmann::json& tools, const std::string& field, std::string& text);

// tool_choice given by name: "auto", "none" or "required" ("function" is the object form's).
std::optional<ToolProblem> read_tool_choice_mode(std::string_view mode, messages::Submit& submit);

// chat_template_kwargs: an object whose keys become the template's variables, none of those the
// server sets itself (model::kReservedTemplateVariables). text: its JSON text.
std::optional<ToolProblem> read_template_kwargs(const nlohmann::json& kwargs, std::string& text);

// One chat turn's tool fields, read: a tool result names the call it answers (tool_call_id);
// only assistant turns make calls (each with an id and a function's name) or have no content.
// field: the turn's path ("messages[2]").
std::optional<ToolProblem> check_turn_tools(const messages::ChatTurn& turn, const std::string& field);

// The checks across fields, once a request is read: tool_choice "required" or a function needs
// tools, and the function it names must be one of them.
std::optional<ToolProblem> check_tool_choice(const messages::Submit& submit);

}  // namespace mqlm::actors::front_end
