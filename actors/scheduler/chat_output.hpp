// A chat request's output as the scheduler reads it (model/chat/output_parser): whether it is
// split into content, reasoning and tool calls and how, and the constraint a forced tool call
// (tool_choice required or a named function) puts on its sampling, as vLLM does it: a
// json_schema response_format made from the tools, which the parser then reads as calls.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>

#include "actors/scheduler/served_model.hpp"
#include "messages/serving.hpp"
#include "model/chat/output_parser.hpp"

namespace mqlm::actors {

struct ChatOutputPlan {
  std::optional<model::OutputParserSetup> setup;  // none: the output is content as it is
  std::optional<model::ResponseFormat> format;    // a forced call's schema, for the sampling
};

// For a submit to model `m`; an error says what is wrong with its tools or tool_choice. The
// setup's starts_in_reasoning is left to the caller, which has the prompt (opens_reasoning).
std::variant<ChatOutputPlan, std::string> chat_output_plan(const ServedModel& m, const messages::Submit& submit);

// Whether the prompt's last tokens, as text, end with an opened <think> block.
bool opens_reasoning(const ServedModel& m, std::span<const std::int32_t> prompt);

// A call's id, unique per server: the Unix time of its request's submit (ns), the request's
// sequence and the call's index, in fixed-width hex.
std::string tool_call_id(std::int64_t submit_unix_ns, std::uint64_t sequence, std::uint32_t index);

// What the parser made, into an event's text, reasoning and tool call pieces (TokenEvent,
// FinalEvent); the first piece of a call gets its id.
template <class Event>
void put_output(Event& event, model::ParsedOutput parsed, std::int64_t submit_unix_ns, std::uint64_t sequence) {
  event.text = std::move(parsed.content);
  event.reasoning = std::move(parsed.reasoning);
  for (auto& piece : parsed.calls) {
    messages::ToolCallDelta delta{piece.index, {}, std::move(piece.name), std::move(piece.arguments)};
    if (!delta.name.empty()) delta.id = tool_call_id(submit_unix_ns, sequence, piece.index);
    event.tool_calls.push_back(std::move(delta));
  }
}

}  // namespace mqlm::actors
