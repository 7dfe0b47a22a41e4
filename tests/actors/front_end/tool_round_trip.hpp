// The tool-calling round trip both front ends' tests send (OpenAI's shapes: JSON for the http
// actor, the same as msgpack for the gateway): two tools, the assistant's parallel calls with no
// content, each call's result, an assistant turn without content or calls, the next question;
// and what the chat turns must hold once read.
#pragma once

#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "messages/serving.hpp"

namespace mqlm::tests {

inline nlohmann::json weather_tools() {
  return nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get-time"}}])");
}

inline nlohmann::json tool_round_trip_messages() {
  return nlohmann::json::parse(R"([
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "call_2", "function": {"name": "get-time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "assistant", "tool_calls": []},
    {"role": "user", "content": "Thanks"}])");
}

inline void expect_tool_round_trip_turns(const std::vector<messages::ChatTurn>& chat) {
  ASSERT_EQ(chat.size(), 6u);
  EXPECT_FALSE(chat[1].has_content);
  ASSERT_EQ(chat[1].tool_calls.size(), 2u);
  EXPECT_EQ(chat[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(chat[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(chat[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(chat[1].tool_calls[1].id, "call_2");
  EXPECT_EQ(chat[1].tool_calls[1].name, "get-time");
  EXPECT_EQ(chat[2].role, "tool");
  EXPECT_EQ(chat[2].tool_call_id, "call_1");
  EXPECT_EQ(chat[2].name, "get_weather");
  EXPECT_EQ(chat[2].content, "18 C");
  EXPECT_TRUE(chat[2].has_content);
  EXPECT_EQ(chat[3].tool_call_id, "call_2");
  EXPECT_EQ(chat[3].content, "12:00");
  EXPECT_FALSE(chat[4].has_content);  // absent, as null
  EXPECT_TRUE(chat[4].tool_calls.empty());
  EXPECT_TRUE(chat[5].has_content);
  EXPECT_EQ(chat[5].content, "Thanks");
}

}  // namespace mqlm::tests
