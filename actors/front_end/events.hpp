// What every front end says about a request's events, whatever its protocol: the client-facing
// names of the wire enums, the final a front end makes itself, and a request's output gathered
// for a caller that does not stream.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "messages/serving.hpp"

namespace mqlm::actors::front_end {

// "malformed", "busy", ...; "stop", "length", ...
std::string_view error_code_name(messages::RequestError code);
std::string_view finish_reason_name(messages::FinishReason reason);

// A FinalEvent for a request the front end ends itself (refused, or its scheduler went silent).
messages::FinalEvent error_final(messages::RequestError code, std::string message);

// A request's output, gathered for a client that does not stream.
struct GatheredOutput {
  std::vector<std::int32_t> tokens;
  std::string text;
  std::vector<messages::TokenLogprobs> logprobs;
  std::string reasoning;                     // a chat's reasoning (TokenEvent::reasoning)
  // Its calls, each one's pieces joined into one (a streaming client's final holds only the
  // pieces held back until the end: a call's later pieces have no id and name).
  std::vector<messages::ToolCallDelta> tool_calls;

  void append(messages::TokenEvent event);
  // All of it: this and what the final event brought (the output held back until the end).
  GatheredOutput with(const messages::FinalEvent& final_event) const;

 private:
  void add_calls(const std::vector<messages::ToolCallDelta>& pieces);
};

}  // namespace mqlm::actors::front_end
