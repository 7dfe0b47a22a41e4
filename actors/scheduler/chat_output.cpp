#include "actors/scheduler/chat_output.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "model/grammar/response_grammar.hpp"

namespace mqlm::actors {

using messages::ToolChoice;

namespace {

// Tokens enough to hold "<think>" and the newlines after it, however a vocabulary splits them.
constexpr std::size_t kPromptTailTokens = 8;

std::optional<std::string> forced_format(const messages::Submit& submit, model::CallReading reading,
                                         ChatOutputPlan& plan) {
  if (submit.sampling.response_format.constrained()) {
    return "response_format cannot go with tool_choice required or a named function: the call's arguments are "
           "the response";
  }
  auto schema = model::forced_call_schema(submit.tools, reading, submit.tool_choice_name, submit.parallel_tool_calls);
  if (auto* e = std::get_if<model::ToolSchemaError>(&schema)) return e->message;
  model::ResponseFormat format{static_cast<std::uint8_t>(model::ResponseKind::json_schema),
                               std::get<std::string>(std::move(schema)), false};
  if (format.schema.size() > model::kMaxSchemaBytes) {
    return fmt::format("tools: the schema of the forced call is {} bytes of JSON, at most {}: give fewer or smaller "
                       "tools", format.schema.size(), model::kMaxSchemaBytes);
  }
  auto grammar = model::grammar::response_grammar(format);
  if (auto* e = std::get_if<model::grammar::SchemaError>(&grammar)) return "tools: parameters " + e->message;
  plan.format = std::move(format);
  return std::nullopt;
}

}  // namespace

std::variant<ChatOutputPlan, std::string> chat_output_plan(const ServedModel& m, const messages::Submit& submit) {
  ChatOutputPlan plan;
  if (static_cast<messages::PromptKind>(submit.prompt_kind) != messages::PromptKind::chat) return plan;
  if (submit.tool_choice > static_cast<std::uint8_t>(ToolChoice::function)) {
    return fmt::format("tool_choice {} is not auto (0), none (1), required (2) or function (3)", submit.tool_choice);
  }
  const auto choice = static_cast<ToolChoice>(submit.tool_choice);
  const bool forced = choice == ToolChoice::required || choice == ToolChoice::function;
  if (forced && submit.tools.empty()) return std::string("tool_choice required or a function needs tools");
  model::OutputParserSetup setup;
  setup.reasoning = m.output.reasoning;
  setup.parallel = submit.parallel_tool_calls;
  if (forced) {
    setup.reasoning = false;  // the grammar makes the output the call from its first token
    setup.calls = choice == ToolChoice::function ? model::CallReading::forced_function
                                                 : model::CallReading::forced_required;
    setup.function = submit.tool_choice_name;
    if (auto error = forced_format(submit, setup.calls, plan)) return *error;
  } else if (choice == ToolChoice::automatic && !submit.tools.empty() &&
             m.output.tool_calls != model::ToolCallFormat::none) {
    setup.calls = model::CallReading::native;
    setup.format = m.output.tool_calls;
  }
  if (setup.reasoning || setup.calls != model::CallReading::none) plan.setup = std::move(setup);
  return plan;
}

bool opens_reasoning(const ServedModel& m, std::span<const std::int32_t> prompt) {
  const std::size_t tail = std::min(prompt.size(), kPromptTailTokens);
  return model::prompt_opens_reasoning(
      m.tokenizer->decode(prompt.subspan(prompt.size() - tail), model::DecodeOptions{true, false}));
}

std::string tool_call_id(std::int64_t submit_unix_ns, std::uint64_t sequence, std::uint32_t index) {
  return fmt::format("call_{:016x}{:08x}{:04x}", static_cast<std::uint64_t>(submit_unix_ns),
                     static_cast<std::uint32_t>(sequence), static_cast<std::uint16_t>(index));
}

}  // namespace mqlm::actors
