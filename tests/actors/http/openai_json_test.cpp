// The OpenAI translation layer of the http actor: request bodies into Submits (and every bad one
// into a 400 naming its field), FinalEvents into HTTP errors, and the serving messages into
// OpenAI's response bodies and SSE chunks.
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "actors/http/openai_json.hpp"
#include "tests/actors/front_end/tool_round_trip.hpp"

namespace mqlm::actors::openai {
namespace {

using messages::FinalEvent;
using messages::FinishReason;
using messages::PromptKind;
using messages::RequestError;
using messages::TokenEvent;
using messages::TokenLogprobs;
using nlohmann::json;

constexpr std::uint64_t kSeed = 1234;

CompletionRequest parse_ok(Endpoint endpoint, const json& body) {
  auto parsed = parse_completion_request(endpoint, body.dump(), kSeed);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    ADD_FAILURE() << "refused: " << error->message;
    return {};
  }
  return std::get<CompletionRequest>(std::move(parsed));
}

ApiError parse_error(Endpoint endpoint, std::string_view body) {
  auto parsed = parse_completion_request(endpoint, body, kSeed);
  if (auto* error = std::get_if<ApiError>(&parsed)) return *error;
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

json chat_body() { return {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}; }

TEST(OpenAiRequest, ChatBodyBecomesAChatSubmitWithEverySamplingField) {
  json body = chat_body();
  body["messages"] = json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                  {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}},
                                                                  {{"type", "text"}, {"text", "b"}}}}},
                                  {{"role", "assistant"}, {"content", nullptr}}});
  body["max_tokens"] = 7;
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["stop"] = "END";
  body["seed"] = 42;
  body["presence_penalty"] = 0.5;
  body["frequency_penalty"] = -1;
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["n"] = 1;
  body["user"] = "someone";
  body["logit_bias"] = {{"50256", -100}, {"7", 2.5}};
  CompletionRequest r = parse_ok(Endpoint::chat, body);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(r.submit.model, "tiny");
  EXPECT_EQ(r.submit.prompt_kind, static_cast<std::uint8_t>(PromptKind::chat));
  ASSERT_EQ(r.submit.chat.size(), 3u);
  EXPECT_EQ(r.submit.chat[0].role, "system");  // developer is OpenAI's newer name for it
  EXPECT_EQ(r.submit.chat[1].content, "a\nb");
  EXPECT_EQ(r.submit.chat[2].content, "");
  const auto& s = r.submit.sampling;
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(s.seed, 42u);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -1.0f);
  EXPECT_TRUE(s.logprobs);
  EXPECT_EQ(s.top_logprobs, 3);
  // nlohmann's objects iterate their keys in order: "50256" before "7".
  EXPECT_EQ(s.logit_bias, (std::vector<model::TokenBias>{{50256, -100.0f}, {7, 2.5f}}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
}

TEST(OpenAiRequest, MaxCompletionTokensWinsAndDefaultsFollowOpenAi) {
  json body = chat_body();
  body["max_tokens"] = 5;
  body["max_completion_tokens"] = 9;
  EXPECT_EQ(parse_ok(Endpoint::chat, body).submit.sampling.max_tokens, 9);

  CompletionRequest plain = parse_ok(Endpoint::chat, chat_body());
  EXPECT_EQ(plain.submit.sampling.seed, kSeed);  // no seed: the caller's
  EXPECT_FALSE(plain.submit.sampling.logprobs);
  EXPECT_FALSE(plain.stream);

  CompletionRequest completion = parse_ok(Endpoint::completions, {{"model", "tiny"}, {"prompt", "x"}});
  EXPECT_EQ(completion.submit.sampling.max_tokens, kCompletionsDefaultMaxTokens);
  EXPECT_EQ(completion.submit.prompt_kind, static_cast<std::uint8_t>(PromptKind::text));
  EXPECT_EQ(completion.submit.text, "x");
}

TEST(OpenAiRequest, CompletionPromptsAsTextOrTokenIds) {
  auto tokens = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", {1, 2, 3}}, {"logprobs", 2}});
  EXPECT_EQ(tokens.submit.prompt_kind, static_cast<std::uint8_t>(PromptKind::tokens));
  EXPECT_EQ(tokens.submit.tokens, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_TRUE(tokens.submit.sampling.logprobs);
  EXPECT_EQ(tokens.submit.sampling.top_logprobs, 2);

  auto nested = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", {{4, 5}}}});
  EXPECT_EQ(nested.submit.tokens, (std::vector<std::int32_t>{4, 5}));
  auto one_string = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", {"hello"}}});
  EXPECT_EQ(one_string.submit.text, "hello");

  // logprobs 0: the chosen token's logprob only.
  auto zero = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 0}});
  EXPECT_TRUE(zero.logprobs);
  EXPECT_EQ(zero.top_logprobs, 0);
}

TEST(OpenAiRequest, TopPZeroIsGreedy) {
  json body = chat_body();
  body["top_p"] = 0;
  auto r = parse_ok(Endpoint::chat, body);
  EXPECT_EQ(r.submit.sampling.temperature, 0.0f);
  EXPECT_EQ(r.submit.sampling.top_p, 1.0f);
}

struct BadBody {
  Endpoint endpoint;
  std::string body;
  std::string param;  // "" : none expected
};

// Which body, in test names and in ctest's: the endpoint and the field it gets wrong.
std::string name(const BadBody& bad) {
  std::string out = bad.endpoint == Endpoint::chat ? "chat_" : "completions_";
  out += bad.param.empty() ? "body" : bad.param;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}

void PrintTo(const BadBody& bad, std::ostream* out) { *out << name(bad); }

class OpenAiBadRequest : public ::testing::TestWithParam<BadBody> {};

TEST_P(OpenAiBadRequest, IsA400NamingTheField) {
  const BadBody& bad = GetParam();
  ApiError error = parse_error(bad.endpoint, bad.body);
  EXPECT_EQ(error.status, 400) << bad.body;
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_FALSE(error.message.empty());
  if (bad.param.empty()) {
    EXPECT_FALSE(error.param.has_value()) << *error.param;
  } else {
    EXPECT_EQ(error.param.value_or("(none)"), bad.param) << error.message;
  }
}

const std::string kMessages = R"("messages": [{"role": "user", "content": "Hi"}])";

INSTANTIATE_TEST_SUITE_P(
    Bodies, OpenAiBadRequest,
    ::testing::Values(
        BadBody{Endpoint::chat, "{not json", ""}, BadBody{Endpoint::chat, "[1, 2]", ""},
        BadBody{Endpoint::chat, "", ""},
        BadBody{Endpoint::chat, "{" + kMessages + "}", "model"},
        BadBody{Endpoint::chat, R"({"model": 7, )" + kMessages + "}", "model"},
        BadBody{Endpoint::chat, R"({"model": "m"})", "messages"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": []})", "messages"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": "Hi"})", "messages"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"content": "Hi"}]})", "messages[0].role"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                "messages[0].content[0].type"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "tool", "content": "x"}]})",
                "messages[0].tool_call_id"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "function", "content": "x"}]})",
                "messages[0].role"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "tool", "tool_call_id": "c", "content": null}]})",
                "messages[0].content"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "tool", "tool_call_id": 7, "content": "x"}]})",
                "messages[0].tool_call_id"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": [)"
                                R"({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})",
                "messages[0].tool_calls"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": {}}]})",
                "messages[0].tool_calls"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [)"
                                R"({"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]})",
                "messages[0].tool_calls[0].function.arguments"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [)"
                                R"({"id": "c", "type": "function", "function": {"name": "f"}}]}]})",
                "messages[0].tool_calls[0].function.arguments"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [)"
                                R"({"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})",
                "messages[0].tool_calls[0].id"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [)"
                                R"({"id": "c", "type": "code", "function": {"name": "f", "arguments": "{}"}}]}]})",
                "messages[0].tool_calls[0].type"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [)"
                                R"({"id": "c", "function": {"name": "get weather", "arguments": "{}"}}]}]})",
                "messages[0].tool_calls[0].function.name"},
        BadBody{Endpoint::chat, R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]})",
                "messages[0].tool_calls[0].function"},
        BadBody{Endpoint::chat, R"({"model": "m", "max_tokens": -1, )" + kMessages + "}", "max_tokens"},
        BadBody{Endpoint::chat, R"({"model": "m", "max_tokens": 0, )" + kMessages + "}", "max_tokens"},
        BadBody{Endpoint::chat, R"({"model": "m", "max_tokens": 99999999999999, )" + kMessages + "}", "max_tokens"},
        BadBody{Endpoint::chat, R"({"model": "m", "max_tokens": 2000000, )" + kMessages + "}", "max_tokens"},
        BadBody{Endpoint::chat, R"({"model": "m", "max_tokens": 1.5, )" + kMessages + "}", "max_tokens"},
        BadBody{Endpoint::chat, R"({"model": "m", "max_tokens": "8", )" + kMessages + "}", "max_tokens"},
        BadBody{Endpoint::chat, R"({"model": "m", "temperature": 2.5, )" + kMessages + "}", "temperature"},
        BadBody{Endpoint::chat, R"({"model": "m", "temperature": -0.1, )" + kMessages + "}", "temperature"},
        BadBody{Endpoint::chat, R"({"model": "m", "top_p": 1.5, )" + kMessages + "}", "top_p"},
        BadBody{Endpoint::chat, R"({"model": "m", "presence_penalty": 3, )" + kMessages + "}", "presence_penalty"},
        BadBody{Endpoint::chat, R"({"model": "m", "logprobs": true, "top_logprobs": 21, )" + kMessages + "}",
                "top_logprobs"},
        BadBody{Endpoint::chat, R"({"model": "m", "top_logprobs": 2, )" + kMessages + "}", "top_logprobs"},
        BadBody{Endpoint::chat, R"({"model": "m", "logprobs": 1, )" + kMessages + "}", "logprobs"},
        BadBody{Endpoint::chat, R"({"model": "m", "n": 2, )" + kMessages + "}", "n"},
        BadBody{Endpoint::chat, R"({"model": "m", "stop": 5, )" + kMessages + "}", "stop"},
        BadBody{Endpoint::chat, R"({"model": "m", "stop": ["a", 1], )" + kMessages + "}", "stop[1]"},
        BadBody{Endpoint::chat, R"({"model": "m", "stop": [""], )" + kMessages + "}", "stop[0]"},
        BadBody{Endpoint::chat, R"({"model": "m", "stream_options": {"include_usage": true}, )" + kMessages + "}",
                "stream_options"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function"}], )" + kMessages + "}",
                "tools[0].function"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": {"type": "function"}, )" + kMessages + "}", "tools"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "retrieval"}], )" + kMessages + "}",
                "tools[0].type"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {}}], )" + kMessages + "}",
                "tools[0].function.name"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "a.b"}}], )" +
                                    kMessages + "}",
                "tools[0].function.name"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": ")" +
                                    std::string(65, 'x') + R"("}}], )" + kMessages + "}",
                "tools[0].function.name"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}, )"
                                R"({"type": "function", "function": {"name": "f"}}], )" + kMessages + "}",
                "tools[1].function.name"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f", )"
                                R"("parameters": "{}"}}], )" + kMessages + "}",
                "tools[0].function.parameters"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f", )"
                                R"("description": 3}}], )" + kMessages + "}",
                "tools[0].function.description"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f", )"
                                R"("parameters": {"x": )" + std::string(40, '[') + std::string(40, ']') + "}}}], " +
                                    kMessages + "}",
                "tools"},
        BadBody{Endpoint::chat, R"({"model": "m", "tool_choice": "sometimes", )" + kMessages + "}", "tool_choice"},
        BadBody{Endpoint::chat, R"({"model": "m", "tool_choice": 1, )" + kMessages + "}", "tool_choice"},
        BadBody{Endpoint::chat, R"({"model": "m", "tool_choice": "required", )" + kMessages + "}", "tool_choice"},
        BadBody{Endpoint::chat, R"({"model": "m", "tool_choice": {"type": "function", "function": {"name": "f"}}, )" +
                                    kMessages + "}",
                "tool_choice"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}], )"
                                R"("tool_choice": {"type": "function", "function": {"name": "g"}}, )" + kMessages + "}",
                "tool_choice.function.name"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}], )"
                                R"("tool_choice": {"type": "function"}, )" + kMessages + "}",
                "tool_choice.function"},
        BadBody{Endpoint::chat, R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}], )"
                                R"("tool_choice": {"function": {"name": "f"}}, )" + kMessages + "}",
                "tool_choice.type"},
        BadBody{Endpoint::chat, R"({"model": "m", "parallel_tool_calls": "yes", )" + kMessages + "}",
                "parallel_tool_calls"},
        BadBody{Endpoint::chat, R"({"model": "m", "chat_template_kwargs": {"add_generation_prompt": false}, )" +
                                    kMessages + "}",
                "chat_template_kwargs.add_generation_prompt"},
        BadBody{Endpoint::chat, R"({"model": "m", "chat_template_kwargs": {"tools": []}, )" + kMessages + "}",
                "chat_template_kwargs.tools"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": [5, 1], )" + kMessages + "}", "logit_bias"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"x5": 1}, )" + kMessages + "}", "logit_bias[\"x5\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"-3": 1}, )" + kMessages + "}", "logit_bias[\"-3\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"": 1}, )" + kMessages + "}", "logit_bias[\"\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"99999999999": 1}, )" + kMessages + "}",
                "logit_bias[\"99999999999\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"5": 101}, )" + kMessages + "}", "logit_bias[\"5\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"5": "1"}, )" + kMessages + "}", "logit_bias[\"5\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "logit_bias": {"5": null}, )" + kMessages + "}", "logit_bias[\"5\"]"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "logit_bias": {"5": 1, "05": 2}})",
                "logit_bias[\"5\"]"},
        BadBody{Endpoint::chat, R"({"model": "m", "frobnicate": 1, )" + kMessages + "}", "frobnicate"},
        BadBody{Endpoint::chat, R"({"model": "m", "ignore_eos": 1, )" + kMessages + "}", "ignore_eos"},
        BadBody{Endpoint::chat, R"({"model": "m", "cache_prompt": "yes", )" + kMessages + "}", "cache_prompt"},
        BadBody{Endpoint::chat, R"({"model": "m", "draft_max": 33, )" + kMessages + "}", "draft_max"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "draft_max": -1})", "draft_max"},
        BadBody{Endpoint::chat, R"({"model": "m", "chat_template_kwargs": [], )" + kMessages + "}",
                "chat_template_kwargs"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "chat_template_kwargs": {}})",
                "chat_template_kwargs"},
        BadBody{Endpoint::chat, R"({"model": "m", "prompt": "x", )" + kMessages + "}", "prompt"},
        BadBody{Endpoint::completions, R"({"model": "m"})", "prompt"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": ["a", "b"]})", "prompt"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": [1, -2]})", "prompt[1]"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": []})", "prompt"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "logprobs": 21})", "logprobs"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "echo": true})", "echo"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "best_of": 3})", "best_of"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", "suffix": "y"})", "suffix"},
        BadBody{Endpoint::completions, R"({"model": "m", "prompt": "x", )" + kMessages + "}", "messages"}),
    [](const ::testing::TestParamInfo<BadBody>& info) { return std::to_string(info.index) + "_" + name(info.param); });

// The extension fields llama-server's and vLLM's clients send: ignore_eos reaches the sampler's
// stop conditions, cache_prompt is accepted (the prefix cache is always on), chat_template_kwargs
// reach the Submit as JSON text.
TEST(OpenAiRequest, CommonExtensionFieldsAreAccepted) {
  json body = chat_body();
  body["ignore_eos"] = true;
  body["cache_prompt"] = false;
  body["chat_template_kwargs"] = {{"enable_thinking", false}, {"custom", {{"a", {1, 2}}}}};
  CompletionRequest chat = parse_ok(Endpoint::chat, body);
  EXPECT_TRUE(chat.submit.sampling.ignore_eos);
  EXPECT_EQ(chat.submit.chat.size(), 1u);
  EXPECT_EQ(json::parse(chat.submit.chat_template_kwargs), body["chat_template_kwargs"]);
  body["chat_template_kwargs"] = json::object();
  EXPECT_EQ(parse_ok(Endpoint::chat, body).submit.chat_template_kwargs, "");
  CompletionRequest plain = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", "x"}, {"cache_prompt", true}});
  EXPECT_FALSE(plain.submit.sampling.ignore_eos);
  EXPECT_TRUE(parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", "x"}, {"ignore_eos", true}})
                  .submit.sampling.ignore_eos);
  // mqlm's own: a request's speculative drafts a step; left out, the server's setting.
  EXPECT_EQ(plain.submit.draft_max, -1);
  EXPECT_EQ(parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", "x"}, {"draft_max", 0}}).submit.draft_max, 0);
  json drafting = chat_body();
  drafting["draft_max"] = 8;
  EXPECT_EQ(parse_ok(Endpoint::chat, drafting).submit.draft_max, 8);
}

// A body within the HTTP limit (1 MB) whose chat_template_kwargs value nests 400,000 arrays deep:
// writing the value out recursed once per level and overflowed the handler's stack (the server
// crashed on one request). The depth is found by looking 32 levels down, no further, and refused.
TEST(OpenAiRequest, ADeeplyNestedTemplateArgumentIsRefusedWithoutWalkingIt) {
  constexpr std::size_t kDepth = 400'000;
  const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}], )"
                           R"("chat_template_kwargs": {"k": )" +
                           std::string(kDepth, '[') + std::string(kDepth, ']') + "}}";
  const ApiError error = parse_error(Endpoint::chat, body);
  EXPECT_EQ(error.param.value_or(""), "chat_template_kwargs");
  EXPECT_NE(error.message.find("deeper than 32"), std::string::npos) << error.message;
}

using tests::weather_tools;

// A whole tool-calling round trip as OpenAI's clients send it back.
TEST(OpenAiRequest, ToolsToolCallsAndToolResultsReachTheSubmit) {
  json body = chat_body();
  body["tools"] = weather_tools();
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get-time"}}}};
  body["parallel_tool_calls"] = false;
  body["messages"] = tests::tool_round_trip_messages();
  const messages::Submit s = parse_ok(Endpoint::chat, body).submit;
  EXPECT_EQ(json::parse(s.tools), weather_tools());
  EXPECT_EQ(s.tool_choice, static_cast<std::uint8_t>(messages::ToolChoice::function));
  EXPECT_EQ(s.tool_choice_name, "get-time");
  EXPECT_FALSE(s.parallel_tool_calls);
  tests::expect_tool_round_trip_turns(s.chat);
  // A tool result may come as text parts too.
  body["messages"][3]["content"] = json::array({{{"type", "text"}, {"text", "12"}}, {{"type", "text"}, {"text", "00"}}});
  EXPECT_EQ(parse_ok(Endpoint::chat, body).submit.chat[3].content, "12\n00");
}

TEST(OpenAiRequest, ToolChoiceByNameAndTheDefaults) {
  json body = chat_body();
  const messages::Submit plain = parse_ok(Endpoint::chat, body).submit;
  EXPECT_EQ(plain.tools, "");
  EXPECT_EQ(plain.tool_choice, static_cast<std::uint8_t>(messages::ToolChoice::automatic));
  EXPECT_TRUE(plain.parallel_tool_calls);
  body["tools"] = weather_tools();
  const std::pair<const char*, messages::ToolChoice> choices[] = {{"auto", messages::ToolChoice::automatic},
                                                                  {"none", messages::ToolChoice::none},
                                                                  {"required", messages::ToolChoice::required}};
  for (const auto& [name, choice] : choices) {
    body["tool_choice"] = name;
    EXPECT_EQ(parse_ok(Endpoint::chat, body).submit.tool_choice, static_cast<std::uint8_t>(choice)) << name;
  }
  // "none" and "auto" ask nothing of tools that are not there; an empty array is none.
  body["tools"] = json::array();
  body["tool_choice"] = "none";
  EXPECT_EQ(parse_ok(Endpoint::chat, body).submit.tools, "");
}

messages::Tokenize tokenize_ok(std::string_view body, bool detokenize) {
  auto parsed = parse_tokenize_request(body, detokenize);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    ADD_FAILURE() << "refused: " << error->message;
    return {};
  }
  return std::get<messages::Tokenize>(std::move(parsed));
}

// llama-server's shape adds no BOS unless asked; vLLM's ("prompt") adds it unless asked not to.
TEST(TokenizeRequest, LlamaServersAndVllmsShapesWithTheirDefaults) {
  auto llama = tokenize_ok(R"({"content": "hi", "with_pieces": true, "parse_special": false})", false);
  EXPECT_EQ(llama.text, "hi");
  EXPECT_FALSE(llama.add_special);
  EXPECT_FALSE(llama.parse_special);
  EXPECT_TRUE(llama.with_pieces);
  EXPECT_TRUE(llama.model.empty());
  auto vllm = tokenize_ok(R"({"model": "tiny", "prompt": "hi"})", false);
  EXPECT_TRUE(vllm.add_special);
  EXPECT_EQ(vllm.model, "tiny");
  EXPECT_FALSE(tokenize_ok(R"({"prompt": "hi", "add_special_tokens": false})", false).add_special);
  auto back = tokenize_ok(R"({"tokens": [1, 2, 3]})", true);
  EXPECT_TRUE(back.detokenize);
  EXPECT_EQ(back.tokens, (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(TokenizeRequest, BadBodiesNameTheField) {
  auto param = [](std::string_view body, bool detokenize) {
    auto parsed = parse_tokenize_request(body, detokenize);
    auto* error = std::get_if<ApiError>(&parsed);
    return error != nullptr && error->status == 400 ? error->param.value_or("(none)") : "(accepted)";
  };
  EXPECT_EQ(param(R"({})", false), "content");
  EXPECT_EQ(param(R"({"content": 5})", false), "content");
  EXPECT_EQ(param(R"({"content": "x", "with_pieces": "yes"})", false), "with_pieces");
  EXPECT_EQ(param(R"({"content": "x", "tokens": [1]})", false), "tokens");  // /detokenize's field
  EXPECT_EQ(param(R"({"tokens": [1, -2]})", true), "tokens[1]");
  EXPECT_EQ(param(R"({"tokens": "1 2"})", true), "tokens");
  EXPECT_EQ(param(R"({"content": "x"})", true), "content");
  EXPECT_EQ(param("[1]", true), "(none)");
}

TEST(TokenizeAnswer, PiecesAreTextOrBytesAndErrorsMapAsFinalsDo) {
  messages::Tokenize question;
  question.with_pieces = true;
  messages::Tokenized answer{0, "", {7, 8}, {"ab", "\xC3"}, ""};
  auto body = tokenized_json(question, answer);
  ASSERT_TRUE(std::holds_alternative<json>(body));
  EXPECT_EQ(std::get<json>(body), json::parse(R"({"count": 2, "tokens": [{"id": 7, "piece": "ab"},
                                                                         {"id": 8, "piece": [195]}]})"));
  question.with_pieces = false;
  EXPECT_EQ(std::get<json>(tokenized_json(question, answer))["tokens"], json({7, 8}));
  question.detokenize = true;
  answer.text = "ab";
  EXPECT_EQ(std::get<json>(tokenized_json(question, answer)), json::parse(R"({"content": "ab", "prompt": "ab"})"));
  answer.error = static_cast<std::uint16_t>(RequestError::unknown_model);
  auto failed = tokenized_json(question, answer);
  ASSERT_TRUE(std::holds_alternative<ApiError>(failed));
  EXPECT_EQ(std::get<ApiError>(failed).status, 404);
}

TEST(OpenAiRequest, DeeplyNestedJsonIsRefusedWithoutCrashing) {
  std::string body(200'000, '[');
  body += std::string(200'000, ']');
  EXPECT_EQ(parse_error(Endpoint::chat, body).status, 400);
  std::string unclosed = R"({"model": "m", "messages": )" + std::string(100'000, '[');
  EXPECT_EQ(parse_error(Endpoint::chat, unclosed).status, 400);
}

FinalEvent failed(RequestError code) { return front_end::error_final(code, "why"); }

TEST(OpenAiErrors, FinalEventsMapToOpenAiStatuses) {
  EXPECT_EQ(error_for(failed(RequestError::unknown_model)).status, 404);
  EXPECT_EQ(error_for(failed(RequestError::unknown_model)).code, "model_not_found");
  EXPECT_EQ(error_for(failed(RequestError::invalid_request)).status, 400);
  EXPECT_EQ(error_for(failed(RequestError::prompt_too_long)).status, 400);
  EXPECT_EQ(error_for(failed(RequestError::prompt_too_long)).code, "context_length_exceeded");
  for (RequestError code : {RequestError::busy, RequestError::unavailable, RequestError::shutting_down}) {
    ApiError error = error_for(failed(code));
    EXPECT_EQ(error.status, 503) << static_cast<int>(code);
    EXPECT_EQ(error.type, "server_error");
    EXPECT_EQ(error.message, "why");
  }
  EXPECT_EQ(error_for(failed(RequestError::gpu)).status, 500);
  EXPECT_EQ(error_for(failed(RequestError::internal)).status, 500);
  FinalEvent aborted;
  aborted.finish = static_cast<std::uint8_t>(FinishReason::abort);
  EXPECT_EQ(error_for(aborted).status, 503);
  EXPECT_FALSE(finish_reason(aborted));

  json body = json::parse(error_body(error_for(failed(RequestError::unknown_model))));
  EXPECT_EQ(body["error"]["message"], "why");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "model");
  EXPECT_EQ(body["error"]["code"], "model_not_found");
}

FinalEvent finished(FinishReason reason, std::uint32_t prompt, std::uint32_t completion, std::uint32_t cached) {
  FinalEvent event;
  event.finish = static_cast<std::uint8_t>(reason);
  event.prompt_tokens = prompt;
  event.completion_tokens = completion;
  event.cached_tokens = cached;
  return event;
}

TokenLogprobs logprob(std::int32_t token, std::string text, float value, std::vector<std::string> tops,
                      std::vector<float> top_values) {
  TokenLogprobs entry;
  entry.token = token;
  entry.text = std::move(text);
  entry.logprob = value;
  for (std::size_t i = 0; i < tops.size(); ++i) entry.top_tokens.push_back(static_cast<std::int32_t>(100 + i));
  entry.top_texts = std::move(tops);
  entry.top_logprobs = std::move(top_values);
  return entry;
}

TEST(OpenAiResponse, ChatBodyHasTheTextFinishReasonUsageAndLogprobs) {
  json body = chat_body();
  body["logprobs"] = true;
  body["top_logprobs"] = 1;
  CompletionRequest request = parse_ok(Endpoint::chat, body);
  front_end::GatheredOutput output;
  TokenEvent event;
  event.text = "Hel";
  event.logprobs = {logprob(1, "Hel", -0.5f, {"Hel", "Yo"}, {-0.5f, -1.0f})};
  output.append(event);
  FinalEvent final_event = finished(FinishReason::length, 5, 1, 2);
  final_event.text = "lo";  // held back until the end
  json r = completion_body(request, {"chatcmpl-x", 1700000000}, output, final_event);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"], "chatcmpl-x");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "tiny");
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "Hel");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json({72, 101, 108}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 1u);  // top_logprobs 1 of the 2 the event had
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "Hel");
  EXPECT_EQ(r["usage"], json::parse(R"({"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                                         "prompt_tokens_details": {"cached_tokens": 2}})"));
}

// A call's pieces as the scheduler sends them: the first with id and name.
messages::ToolCallDelta call_piece(std::uint32_t index, std::string name, std::string arguments) {
  return {index, name.empty() ? std::string{} : "call_" + std::to_string(index), std::move(name),
          std::move(arguments)};
}

TEST(OpenAiResponse, ChatBodyHasToolCallsAndReasoningApart) {
  CompletionRequest request = parse_ok(Endpoint::chat, chat_body());
  front_end::GatheredOutput output;
  TokenEvent thinking;
  thinking.reasoning = "The user wants ";
  output.append(thinking);
  TokenEvent call;
  call.reasoning = "the weather.";
  call.tool_calls = {call_piece(0, "get_weather", "{\"city\": "), call_piece(0, "", "\"Paris\"}"),
                     call_piece(1, "now", "{}")};
  output.append(call);
  FinalEvent final_event = finished(FinishReason::tool_calls, 5, 9, 0);
  json r = completion_body(request, {"chatcmpl-t", 1}, output, final_event);
  const json& message = r["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());  // only calls
  EXPECT_EQ(message["reasoning_content"], "The user wants the weather.");
  EXPECT_EQ(message["tool_calls"], json::parse(R"([
      {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}])"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  // Without calls or reasoning: content as ever, no other keys.
  front_end::GatheredOutput plain;
  json p = completion_body(request, {"chatcmpl-p", 1}, plain, finished(FinishReason::stop, 1, 0, 0));
  EXPECT_EQ(p["choices"][0]["message"]["content"], "");
  EXPECT_FALSE(p["choices"][0]["message"].contains("tool_calls"));
  EXPECT_FALSE(p["choices"][0]["message"].contains("reasoning_content"));
}

TEST(OpenAiResponse, CompletionLogprobsHaveOffsetsAndTheChosenTokenAmongTheTop) {
  std::vector<TokenLogprobs> entries{logprob(1, "h\xC3", -0.1f, {"x"}, {-0.05f}),  // half of an é
                                     logprob(2, "\xA9!", -0.2f, {"\xA9!"}, {-0.2f}),
                                     logprob(3, " ok", -0.3f, {}, {})};
  std::size_t offset = 10;
  json lp = completion_logprobs(entries, 1, offset);
  EXPECT_EQ(lp["token_logprobs"], json({-0.10000000149011612, -0.20000000298023224, -0.30000001192092896}));
  EXPECT_EQ(lp["text_offset"], json({10, 12, 13}));  // characters: "h" and the é's first byte, then "!"
  EXPECT_EQ(offset, 16u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);  // the alternative and the chosen token
  EXPECT_EQ(lp["top_logprobs"][1].size(), 1u);  // the alternative was the chosen token
  EXPECT_EQ(lp["top_logprobs"][2].size(), 1u);
  // A piece that is part of a character is still valid JSON text.
  std::string text = sse_event(lp);
  EXPECT_NO_THROW(json::parse(text.substr(6)));
}

// Two byte tokens that are each half of a character both read U+FFFD as JSON text: their ids
// (and, when asked, "token_id:N" names) keep them apart.
TEST(OpenAiResponse, LogprobsOfTwoTokensOfTheSameTextKeepBothIds) {
  const TokenLogprobs entry = logprob(7, "\xC3", -0.25f, {"\xC3", "\xE2"}, {-0.25f, -1.5f});
  std::size_t offset = 0;
  const json completion = json::parse(dump(completion_logprobs({entry}, 2, offset)));
  EXPECT_EQ(completion["token_ids"], json({7}));
  // OpenAI's map keyed by text has lost one of the three (100 and 7 are the same piece, 101 another
  // half character): keyed by id, all three stay.
  EXPECT_EQ(completion["top_logprobs"][0].size(), 1u);
  EXPECT_EQ(completion["top_logprobs_by_id"][0], json::parse(R"({"7": -0.25, "100": -0.25, "101": -1.5})"));

  const json chat = json::parse(dump(chat_logprobs({entry}, 2)));
  EXPECT_EQ(chat[0]["id"], 7);
  EXPECT_EQ(chat[0]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(chat[0]["bytes"], json({0xC3}));
  ASSERT_EQ(chat[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat[0]["top_logprobs"][0]["id"], 100);
  EXPECT_EQ(chat[0]["top_logprobs"][1]["id"], 101);
  EXPECT_EQ(chat[0]["top_logprobs"][1]["bytes"], json({0xE2}));
}

TEST(OpenAiResponse, TokensAsTokenIdsNameEveryTokenByItsId) {
  CompletionRequest request = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 2},
                                                              {"return_tokens_as_token_ids", true}});
  ASSERT_TRUE(request.tokens_as_ids);
  const TokenLogprobs entry = logprob(7, "\xC3", -0.25f, {"\xC3", "\xE2"}, {-0.25f, -1.5f});
  std::size_t offset = 0;
  const json completion = completion_logprobs({entry}, 2, offset, request.tokens_as_ids);
  EXPECT_EQ(completion["tokens"], json({"token_id:7"}));
  EXPECT_EQ(completion["top_logprobs"][0],
            json::parse(R"({"token_id:7": -0.25, "token_id:100": -0.25, "token_id:101": -1.5})"));
  EXPECT_EQ(offset, 1u);  // offsets still count the text's characters
  const json chat = chat_logprobs({entry}, 1, true);
  EXPECT_EQ(chat[0]["token"], "token_id:7");
  EXPECT_EQ(chat[0]["bytes"], json({0xC3}));
  EXPECT_EQ(chat[0]["top_logprobs"][0]["token"], "token_id:100");
}

TEST(OpenAiResponse, MinusInfinityLogprobsAreWrittenAsOpenAiDoes) {
  auto content = chat_logprobs({logprob(1, "a", -INFINITY, {}, {})}, 0);
  EXPECT_EQ(content[0]["logprob"], -9999.0);
}

// The data of each "data: " event, "[DONE]" as a string.
std::vector<json> events(const std::string& sse) {
  std::vector<json> out;
  std::size_t at = 0;
  while (at < sse.size()) {
    const std::size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string line = sse.substr(at, end - at);
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    const std::string data = line.substr(6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    at = end + 2;
  }
  return out;
}

TEST(OpenAiStream, ChatChunksStartWithTheRoleAndEndWithUsageThenDone) {
  json body = chat_body();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  StreamRenderer renderer(parse_ok(Endpoint::chat, body), {"chatcmpl-s", 7});
  std::string sse = renderer.start();
  TokenEvent empty;  // text held back: nothing to send
  EXPECT_EQ(renderer.tokens(empty), "");
  TokenEvent event;
  event.text = "Hi";
  sse += renderer.tokens(event);
  FinalEvent final_event = finished(FinishReason::stop, 3, 2, 0);
  final_event.text = "!";
  sse += renderer.finish(final_event);
  auto chunks = events(sse);
  ASSERT_EQ(chunks.size(), 6u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(chunks[1]["usage"].is_null());
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["content"], "!");
  EXPECT_EQ(chunks[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[4]["choices"], json::array());
  EXPECT_EQ(chunks[4]["usage"]["total_tokens"], 5);
  EXPECT_EQ(chunks[5], "[DONE]");
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(chunks[i]["id"], "chatcmpl-s");
}

TEST(OpenAiStream, ChatDeltasCarryReasoningAndToolCallPieces) {
  json body = chat_body();
  body["stream"] = true;
  StreamRenderer renderer(parse_ok(Endpoint::chat, body), {"chatcmpl-t", 7});
  std::string sse = renderer.start();
  TokenEvent thinking;
  thinking.reasoning = "hmm";
  sse += renderer.tokens(thinking);
  TokenEvent first;
  first.tool_calls = {call_piece(0, "get_weather", "{\"ci")};
  sse += renderer.tokens(first);
  FinalEvent final_event = finished(FinishReason::tool_calls, 3, 2, 0);
  final_event.tool_calls = {call_piece(0, "", "ty\": 1}")};
  sse += renderer.finish(final_event);
  auto chunks = events(sse);
  ASSERT_EQ(chunks.size(), 6u);
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], (json{{"reasoning_content", "hmm"}}));
  EXPECT_EQ(chunks[2]["choices"][0]["delta"], json::parse(R"({"tool_calls": [{"index": 0, "id": "call_0",
      "type": "function", "function": {"name": "get_weather", "arguments": "{\"ci"}}]})"));
  // A later piece: index and arguments only.
  EXPECT_EQ(chunks[3]["choices"][0]["delta"],
            json::parse(R"({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": 1}"}}]})"));
  EXPECT_EQ(chunks[4]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(chunks[5], "[DONE]");
}

TEST(OpenAiStream, CompletionLogprobOffsetsContinueAcrossChunks) {
  CompletionRequest request = parse_ok(Endpoint::completions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 0},
                                                               {"stream", true}});
  StreamRenderer renderer(request, {"cmpl-s", 7});
  EXPECT_EQ(renderer.start(), "");
  TokenEvent first;
  first.text = "ab";
  first.logprobs = {logprob(1, "ab", -1.0f, {}, {})};
  TokenEvent second;
  second.text = "c";
  second.logprobs = {logprob(2, "c", -2.0f, {}, {})};
  std::string sse = renderer.tokens(first);
  sse += renderer.tokens(second);
  sse += renderer.finish(finished(FinishReason::length, 1, 2, 0));
  auto chunks = events(sse);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "ab");
  EXPECT_EQ(chunks[1]["choices"][0]["logprobs"]["text_offset"], json({2}));
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(chunks[2].contains("usage"));  // not asked for
  EXPECT_EQ(chunks[3], "[DONE]");
}

TEST(OpenAiStream, AnErrorAfterTheHeadersIsAnErrorEvent) {
  json body = chat_body();
  body["stream"] = true;
  StreamRenderer renderer(parse_ok(Endpoint::chat, body), {"chatcmpl-e", 7});
  auto chunks = events(renderer.finish(failed(RequestError::gpu)));
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["error"]["type"], "server_error");
  EXPECT_EQ(chunks[0]["error"]["message"], "why");
  EXPECT_EQ(chunks[1], "[DONE]");
}

}  // namespace
}  // namespace mqlm::actors::openai
