#include "actors/front_end/events.hpp"

#include <algorithm>

namespace mqlm::actors::front_end {

using messages::RequestError;

std::string_view error_code_name(RequestError code) {
  switch (code) {
    case RequestError::none: return "none";
    case RequestError::invalid_request: return "invalid_request";
    case RequestError::unknown_model: return "unknown_model";
    case RequestError::prompt_too_long: return "prompt_too_long";
    case RequestError::busy: return "busy";
    case RequestError::unavailable: return "unavailable";
    case RequestError::gpu: return "gpu";
    case RequestError::internal: return "internal";
    case RequestError::shutting_down: return "shutting_down";
    case RequestError::malformed: return "malformed";
    case RequestError::insufficient_memory: return "insufficient_memory";
    case RequestError::model_failed: return "model_failed";
    case RequestError::unauthorized: return "unauthorized";
    case RequestError::forbidden: return "forbidden";
  }
  return "internal";
}

std::string_view finish_reason_name(messages::FinishReason reason) {
  switch (reason) {
    case messages::FinishReason::stop: return "stop";
    case messages::FinishReason::length: return "length";
    case messages::FinishReason::abort: return "abort";
    case messages::FinishReason::error: return "error";
    case messages::FinishReason::tool_calls: return "tool_calls";
  }
  return "error";
}

messages::FinalEvent error_final(RequestError code, std::string message) {
  messages::FinalEvent event;
  event.finish = static_cast<std::uint8_t>(messages::FinishReason::error);
  event.error = static_cast<std::uint16_t>(code);
  event.message = std::move(message);
  return event;
}

void GatheredOutput::append(messages::TokenEvent event) {
  tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
  text += event.text;
  for (auto& entry : event.logprobs) logprobs.push_back(std::move(entry));
  reasoning += event.reasoning;
  add_calls(event.tool_calls);
}

GatheredOutput GatheredOutput::with(const messages::FinalEvent& final_event) const {
  GatheredOutput all = *this;
  all.text += final_event.text;
  all.reasoning += final_event.reasoning;
  all.add_calls(final_event.tool_calls);
  return all;
}

// A piece adds to its call, or starts it.
void GatheredOutput::add_calls(const std::vector<messages::ToolCallDelta>& pieces) {
  for (const auto& piece : pieces) {
    auto call = std::find_if(tool_calls.begin(), tool_calls.end(),
                             [&](const messages::ToolCallDelta& c) { return c.index == piece.index; });
    if (call != tool_calls.end()) {
      call->arguments += piece.arguments;
    } else {
      tool_calls.push_back(piece);
    }
  }
}

}  // namespace mqlm::actors::front_end
