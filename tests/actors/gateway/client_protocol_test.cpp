// The client protocol on its own: frames (msgpack, built with nlohmann::json as a foreign
// client would) parsed into requests or error values, and events encoded and read back.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "actors/gateway/client_protocol.hpp"
#include "tests/actors/front_end/tool_round_trip.hpp"

namespace mqlm::actors::client_protocol {
namespace {

using messages::RequestError;
using nlohmann::json;

ClientRequest parse_bytes(const std::string& bytes) {
  return parse_request(std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
}

ClientRequest parse(const json& request) {
  auto bytes = json::to_msgpack(request);
  return parse_request(std::as_bytes(std::span(bytes)));
}

std::string packed(const json& value) {
  auto bytes = json::to_msgpack(value);
  return std::string(bytes.begin(), bytes.end());
}

json read(const std::string& event) { return json::from_msgpack(event); }

TEST(ClientProtocolTest, GenerateTakesEveryKey) {
  auto parsed = parse({{"op", "generate"},
                       {"id", "req-1"},
                       {"model", "qwen"},
                       {"prompt", "Hello"},
                       {"stream", false},
                       {"max_tokens", 17},
                       {"temperature", 0.5},
                       {"top_k", 40},
                       {"top_p", 0.9},
                       {"min_p", 0.05},
                       {"repetition_penalty", 1.1},
                       {"repetition_last_n", 32},
                       {"presence_penalty", -0.5},
                       {"frequency_penalty", 1.5},
                       {"seed", 18446744073709551615ull},
                       {"stop", {"\n\n", "END"}},
                       {"stop_token_ids", {2, 7}},
                       {"logprobs", true},
                       {"top_logprobs", 3}});
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  EXPECT_EQ(request->id, ClientId{std::string("req-1")});
  EXPECT_FALSE(request->stream);
  const messages::Submit& submit = request->submit;
  EXPECT_EQ(submit.model, "qwen");
  EXPECT_EQ(submit.prompt_kind, static_cast<std::uint8_t>(messages::PromptKind::text));
  EXPECT_EQ(submit.text, "Hello");
  const model::SamplingParams& s = submit.sampling;
  EXPECT_EQ(s.max_tokens, 17);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_EQ(s.repetition_last_n, 32);
  EXPECT_FLOAT_EQ(s.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 1.5f);
  EXPECT_EQ(s.seed, 18446744073709551615ull);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<std::int32_t>{2, 7}));
  EXPECT_TRUE(s.logprobs);
  EXPECT_EQ(s.top_logprobs, 3);
}

// A generate frame whose logit_bias map holds `entries` pairs packed by pack_entries: json objects
// cannot hold the integer keys the protocol uses.
std::string with_logit_bias(std::uint32_t entries,
                            const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& pack_entries) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_map(4);
  packer.pack("op").pack("generate").pack("id").pack(1).pack("prompt").pack("x").pack("logit_bias");
  packer.pack_map(entries);
  pack_entries(packer);
  return std::string(buffer.data(), buffer.size());
}

TEST(ClientProtocolTest, LogitBiasIsAMapFromTokenIdsToNumbers) {
  auto parsed = parse_bytes(with_logit_bias(2, [](auto& p) { p.pack(50256).pack(-100).pack(7).pack(2.5); }));
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  EXPECT_EQ(request->submit.sampling.logit_bias, (std::vector<model::TokenBias>{{50256, -100.0f}, {7, 2.5f}}));
  auto empty = parse(json{{"op", "generate"}, {"id", 1}, {"prompt", "x"}, {"logit_bias", json::object()}});
  ASSERT_NE(std::get_if<GenerateRequest>(&empty), nullptr);
}

TEST(ClientProtocolTest, OmittedKeysTakeTheDocumentedDefaults) {
  auto parsed = parse({{"op", "generate"}, {"id", -5}, {"tokens", {1, 2, 3}}, {"temperature", 0}});
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  EXPECT_EQ(request->id, ClientId{std::int64_t{-5}});
  EXPECT_TRUE(request->stream);
  EXPECT_EQ(request->submit.model, "");
  EXPECT_EQ(request->submit.prompt_kind, static_cast<std::uint8_t>(messages::PromptKind::tokens));
  EXPECT_EQ(request->submit.tokens, (std::vector<std::int32_t>{1, 2, 3}));
  model::SamplingParams defaults;
  defaults.temperature = 0.0f;  // an integer is a number too
  EXPECT_EQ(messages::pack_payload(messages::Submit{"", 2, "", {1, 2, 3}, {}, defaults}),
            messages::pack_payload(request->submit));
}

TEST(ClientProtocolTest, PoolingMakesAnEmbeddingRequest) {
  auto parsed = parse({{"op", "generate"}, {"id", 1}, {"prompt", "hi"}, {"pooling", "last"}});
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  EXPECT_EQ(request->submit.pooling, 2);
  auto bad = parse({{"op", "generate"}, {"id", 1}, {"prompt", "hi"}, {"pooling", "cls"}});
  ASSERT_TRUE(std::holds_alternative<RequestProblem>(bad));
  EXPECT_NE(std::get<RequestProblem>(bad).message.find("pooling"), std::string::npos);
  messages::FinalEvent event;
  event.finish = static_cast<std::uint8_t>(messages::FinishReason::stop);
  event.embedding = {0.5f, -0.25f};
  EXPECT_EQ(read(encode_final_event(ClientId{std::int64_t{1}}, event, {}, false))["embedding"], (json{0.5, -0.25}));
}

TEST(ClientProtocolTest, ResponseFormatCarriesTheSchemaTextAsWritten) {
  const std::string schema = R"({"type":"object","properties":{"z":{"type":"string"},"a":{"enum":[1,2]}}})";
  auto parsed = parse({{"op", "generate"}, {"id", 1}, {"prompt", "hi"},
                       {"response_format", {{"type", "json_schema"}, {"schema", schema}, {"strict", true}}}});
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  const model::ResponseFormat& format = request->submit.sampling.response_format;
  EXPECT_EQ(format.kind, static_cast<std::uint8_t>(model::ResponseKind::json_schema));
  EXPECT_EQ(format.schema, schema);  // text: the properties keep the client's order
  EXPECT_TRUE(format.strict);
  auto object = parse({{"op", "generate"}, {"id", 1}, {"prompt", "hi"}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(std::holds_alternative<GenerateRequest>(object));
  EXPECT_EQ(std::get<GenerateRequest>(object).submit.sampling.response_format.kind,
            static_cast<std::uint8_t>(model::ResponseKind::json_object));
  const std::vector<std::pair<json, std::string>> refusals = {
      {{{"type", "json_schema"}, {"schema", R"({"type":"string","pattern":"a"})"}}, "the keyword 'pattern' is not supported"},
      {{{"type", "json_schema"}, {"schema", "{not json"}}, "the schema is not valid JSON"},
      {{{"type", "json_schema"}}, "needs its schema"},
      {{{"type", "yaml"}}, "response_format.type must be"},
      {{{"type", "json_object"}, {"schema", 5}}, "'response_format.schema' must be a string"},
  };
  for (const auto& [format_json, says] : refusals) {
    auto bad = parse({{"op", "generate"}, {"id", 1}, {"prompt", "hi"}, {"response_format", format_json}});
    ASSERT_TRUE(std::holds_alternative<RequestProblem>(bad)) << format_json.dump();
    EXPECT_NE(std::get<RequestProblem>(bad).message.find(says), std::string::npos) << std::get<RequestProblem>(bad).message;
  }
}

TEST(ClientProtocolTest, MessagesBecomeAChat) {
  auto parsed = parse({{"op", "generate"},
                       {"id", 1},
                       {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"content", "Hi"}, {"role", "user"}}}}});
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  EXPECT_EQ(request->submit.prompt_kind, static_cast<std::uint8_t>(messages::PromptKind::chat));
  ASSERT_EQ(request->submit.chat.size(), 2u);
  EXPECT_EQ(request->submit.chat[0].role, "system");
  EXPECT_EQ(request->submit.chat[0].content, "Be brief.");
  EXPECT_EQ(request->submit.chat[1].role, "user");
  EXPECT_EQ(request->submit.chat[1].content, "Hi");
}

// A tool-calling round trip as the native protocol carries it: tools as JSON text (OpenAI's
// array), the assistant's calls and the tool results in OpenAI's shape, as msgpack maps.
TEST(ClientProtocolTest, ToolsToolCallsAndTemplateArgumentsReachTheSubmit) {
  const std::string tools = tests::weather_tools().dump();
  auto parsed = parse({{"op", "generate"},
                       {"id", 3},
                       {"messages", tests::tool_round_trip_messages()},
                       {"tools", tools},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                       {"parallel_tool_calls", false},
                       {"chat_template_kwargs", {{"enable_thinking", false}, {"depth", {{"n", 2.5}}}}},
                       {"draft_max", 6}});
  auto* request = std::get_if<GenerateRequest>(&parsed);
  ASSERT_NE(request, nullptr) << std::get<RequestProblem>(parsed).message;
  const messages::Submit& s = request->submit;
  EXPECT_EQ(s.tools, tools);
  EXPECT_EQ(s.tool_choice, static_cast<std::uint8_t>(messages::ToolChoice::function));
  EXPECT_EQ(s.tool_choice_name, "get_weather");
  EXPECT_FALSE(s.parallel_tool_calls);
  EXPECT_EQ(s.draft_max, 6);
  EXPECT_EQ(json::parse(s.chat_template_kwargs), json({{"enable_thinking", false}, {"depth", {{"n", 2.5}}}}));
  tests::expect_tool_round_trip_turns(s.chat);
  for (const char* mode : {"auto", "none", "required"}) {
    auto by_name = parse({{"op", "generate"}, {"id", 4}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                          {"tools", tools}, {"tool_choice", mode}});
    ASSERT_TRUE(std::holds_alternative<GenerateRequest>(by_name)) << std::get<RequestProblem>(by_name).message;
  }
}

TEST(ClientProtocolTest, AbortAndStatus) {
  auto abort = parse({{"op", "abort"}, {"id", "x"}});
  ASSERT_NE(std::get_if<AbortRequest>(&abort), nullptr);
  EXPECT_EQ(std::get<AbortRequest>(abort).id, ClientId{std::string("x")});

  auto status = parse({{"op", "status"}});
  ASSERT_NE(std::get_if<StatusRequest>(&status), nullptr);
  EXPECT_FALSE(std::get<StatusRequest>(status).id.has_value());
  EXPECT_FALSE(std::get<StatusRequest>(status).trim);

  status = parse({{"op", "status"}, {"id", 9}, {"trim", true}});
  ASSERT_NE(std::get_if<StatusRequest>(&status), nullptr);
  EXPECT_EQ(std::get<StatusRequest>(status).id, ClientId{std::int64_t{9}});
  EXPECT_TRUE(std::get<StatusRequest>(status).trim);
}

TEST(ClientProtocolTest, AnyRequestMayCarryAnApiKeyWhichTheRequestLeavesOut) {
  for (const json& frame : {json{{"op", "status"}, {"api_key", "k1"}},
                            json{{"op", "abort"}, {"id", 3}, {"api_key", "k1"}},
                            json{{"op", "unload"}, {"model", "m"}, {"api_key", "k1"}},
                            json{{"op", "generate"}, {"id", 1}, {"prompt", "hi"}, {"api_key", "k1"}}}) {
    auto bytes = json::to_msgpack(frame);
    std::string key;
    auto parsed = parse_request(std::as_bytes(std::span(bytes)), &key);
    EXPECT_EQ(std::get_if<RequestProblem>(&parsed), nullptr) << frame.dump();
    EXPECT_EQ(key, "k1") << frame.dump();
  }
  std::string key = "stale";
  auto bytes = json::to_msgpack(json{{"op", "status"}});
  parse_request(std::as_bytes(std::span(bytes)), &key);
  EXPECT_EQ(key, "");

  auto wrong_type = parse({{"op", "generate"}, {"id", 1}, {"prompt", "hi"}, {"api_key", 5}});
  ASSERT_NE(std::get_if<RequestProblem>(&wrong_type), nullptr);
  EXPECT_TRUE(std::get<RequestProblem>(wrong_type).generate);  // answered by a final, naming the key
  EXPECT_NE(std::get<RequestProblem>(wrong_type).message.find("api_key"), std::string::npos);
  auto too_long = parse({{"op", "status"}, {"api_key", std::string(kMaxApiKeyBytes + 1, 'k')}});
  ASSERT_NE(std::get_if<RequestProblem>(&too_long), nullptr);
}

AdminRequest admin(const ClientRequest& parsed) {
  const auto* request = std::get_if<AdminRequest>(&parsed);
  if (request == nullptr) {
    ADD_FAILURE() << "not an admin request: " << std::get<RequestProblem>(parsed).message;
    return {};
  }
  return *request;
}

TEST(ClientProtocolTest, LoadTakesAModelAndAnOptionalId) {
  AdminRequest load = admin(parse({{"op", "load"}, {"id", 7}, {"model", "qwen"}}));
  EXPECT_EQ(load.op, AdminOp::load);
  EXPECT_EQ(load.id, std::optional<ClientId>(ClientId{std::int64_t{7}}));
  EXPECT_EQ(load.model, "qwen");
  EXPECT_FALSE(load.if_idle);

  load = admin(parse({{"op", "load"}, {"id", "L1"}, {"model", "qwen"}}));
  EXPECT_EQ(load.id, std::optional<ClientId>(ClientId{std::string("L1")}));

  load = admin(parse({{"model", "qwen"}, {"op", "load"}}));
  EXPECT_EQ(load.op, AdminOp::load);
  EXPECT_FALSE(load.id.has_value());
  EXPECT_EQ(load.model, "qwen");
}

TEST(ClientProtocolTest, UnloadTakesIfIdle) {
  AdminRequest unload = admin(parse({{"op", "unload"}, {"id", 2}, {"model", "a"}, {"if_idle", true}}));
  EXPECT_EQ(unload.op, AdminOp::unload);
  EXPECT_EQ(unload.id, std::optional<ClientId>(ClientId{std::int64_t{2}}));
  EXPECT_EQ(unload.model, "a");
  EXPECT_TRUE(unload.if_idle);

  unload = admin(parse({{"op", "unload"}, {"model", "a"}, {"if_idle", false}}));
  EXPECT_FALSE(unload.if_idle);
  EXPECT_FALSE(admin(parse({{"op", "unload"}, {"model", "a"}})).if_idle);
}

TEST(ClientProtocolTest, ModelsListsEveryModelOrOne) {
  AdminRequest models = admin(parse({{"op", "models"}}));
  EXPECT_EQ(models.op, AdminOp::models);
  EXPECT_FALSE(models.id.has_value());
  EXPECT_EQ(models.model, "");

  models = admin(parse({{"op", "models"}, {"id", "m"}, {"model", "b"}}));
  EXPECT_EQ(models.op, AdminOp::models);
  EXPECT_EQ(models.id, std::optional<ClientId>(ClientId{std::string("m")}));
  EXPECT_EQ(models.model, "b");
}

TEST(ClientProtocolTest, ClearCacheNamesItsTier) {
  AdminRequest hot = admin(parse({{"op", "clear_cache"}, {"id", "c1"}, {"tier", "hot"}}));
  EXPECT_EQ(hot.op, AdminOp::clear_cache);
  EXPECT_EQ(hot.id, std::optional<ClientId>(ClientId{std::string("c1")}));
  EXPECT_EQ(hot.tier, messages::CacheTier::hot);

  AdminRequest ssd = admin(parse({{"tier", "ssd"}, {"op", "clear_cache"}}));
  EXPECT_EQ(ssd.op, AdminOp::clear_cache);
  EXPECT_FALSE(ssd.id.has_value());
  EXPECT_EQ(ssd.tier, messages::CacheTier::ssd);
}

// A map header (fixmap of n pairs) followed by the given packed keys and values, so tests can
// write what a json object cannot hold: repeated keys, keys that are not strings.
std::string raw_map(std::uint8_t pairs, const std::vector<json>& items) {
  std::string out(1, static_cast<char>(0x80 | pairs));
  for (const auto& item : items) out += packed(item);
  return out;
}

// {"op": "generate", "id": 1, "messages": [{"role": "user", "content": "x"}],
//  "chat_template_kwargs": {"k": <4 bytes of bin>}}
std::string chat_with_binary_kwargs() {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_map(4);
  pk.pack("op").pack("generate").pack("id").pack(1).pack("messages");
  pk.pack_array(1).pack_map(2).pack("role").pack("user").pack("content").pack("x");
  pk.pack("chat_template_kwargs").pack_map(1).pack("k").pack_bin(4).pack_bin_body("abcd", 4);
  return std::string(buffer.data(), buffer.size());
}

struct BadFrame {
  std::string name;
  std::string bytes;
  RequestError code;
  std::string mentions;           // the message names this
  std::optional<ClientId> id;     // the id the problem carries
  bool generate = false;
};

std::vector<BadFrame> bad_frames() {
  const json ok = {{"op", "generate"}, {"id", 1}, {"prompt", "x"}};
  auto with = [&](const std::string& key, json value) {
    json request = ok;
    request[key] = std::move(value);
    return packed(request);
  };
  auto without = [&](const std::string& key) {
    json request = ok;
    request.erase(key);
    return packed(request);
  };
  const ClientId one{std::int64_t{1}};
  std::string deep = "\x81\xa2op";  // {"op": [[[[...]]]]}
  deep += std::string(20, '\x91') + '\x01';
  std::string huge_declared = raw_map(3, {"op", "generate", "id", 1, "tokens"});
  huge_declared += "\xdd\xff\xff\xff\xff";  // an array claiming 4 billion elements, with none
  auto chat = [](json turns) { return packed({{"op", "generate"}, {"id", 1}, {"messages", std::move(turns)}}); };
  auto chat_with = [](const std::string& key, json value) {
    return packed({{"op", "generate"}, {"id", 1}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {key, value}});
  };
  auto without_key = [](json object, const std::string& key) {
    object.erase(key);
    return object;
  };
  const json call = {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
  json bad_name = call, map_arguments = call, code_call = call, extra_key = call;
  bad_name["function"]["name"] = "a b";
  map_arguments["function"]["arguments"] = json::object();
  code_call["type"] = "code";
  extra_key["index"] = 0;
  json many_keys = ok;
  for (int i = 0; i < 40; ++i) many_keys["k" + std::to_string(i)] = i;
  return {
      {"not msgpack", "\xc1", RequestError::malformed, "msgpack", std::nullopt},
      {"truncated", "\x83\xa2op", RequestError::malformed, "msgpack", std::nullopt},
      {"trailing bytes", packed(ok) + "\x01", RequestError::malformed, "trailing", std::nullopt},
      {"an array", packed(json::array({"generate", 1})), RequestError::malformed, "not a map", std::nullopt},
      {"a string", packed("generate"), RequestError::malformed, "not a map", std::nullopt},
      {"integer key", raw_map(3, {"op", "generate", "id", 1, 5, "x"}), RequestError::malformed, "key is an integer",
       one, true},
      {"too many keys", packed(many_keys), RequestError::malformed, "keys", std::nullopt},
      {"huge declared array", huge_declared, RequestError::malformed, "msgpack", std::nullopt},
      {"deep nesting", deep, RequestError::malformed, "msgpack", std::nullopt},
      {"frame over the limit", with("prompt", std::string(kMaxFrameBytes, 'a')), RequestError::malformed,
       "at most 1000000", std::nullopt},
      {"no op", without("op"), RequestError::malformed, "'op' is missing", one},
      {"op not a string", with("op", 3), RequestError::malformed, "'op' must be a string", one},
      {"unknown op", with("op", "explode"), RequestError::malformed, "unknown op 'explode'", one},
      {"repeated op", raw_map(3, {"op", "generate", "op", "abort", "id", 1}), RequestError::malformed,
       "'op' appears twice", one},
      {"no id", without("id"), RequestError::malformed, "'id' is missing", std::nullopt},
      {"id an array", with("id", {1}), RequestError::malformed, "'id' must be a string or an integer", std::nullopt},
      {"id too long", with("id", std::string(300, 'i')), RequestError::malformed, "'id' is 300 bytes",
       std::nullopt},
      {"id over int64", with("id", 18446744073709551615ull), RequestError::malformed, "64-bit", std::nullopt},
      {"repeated id", raw_map(4, {"op", "generate", "id", 1, "id", 2, "prompt", "x"}), RequestError::malformed,
       "'id' appears twice", std::nullopt},
      {"repeated key", raw_map(4, {"op", "generate", "id", 1, "prompt", "x", "prompt", "y"}),
       RequestError::malformed, "'prompt' appears twice", one, true},
      {"unknown key", with("temprature", 0.5), RequestError::malformed, "'temprature'", one, true},
      {"temperature a string", with("temperature", "hot"), RequestError::malformed,
       "'temperature' must be a number, not a string", one, true},
      {"stream a string", with("stream", "yes"), RequestError::malformed, "'stream' must be true or false", one,
       true},
      {"max_tokens a float", with("max_tokens", 1.5), RequestError::malformed, "'max_tokens' must be an integer",
       one, true},
      {"model too long", with("model", std::string(300, 'm')), RequestError::invalid_request, "model is 300 bytes",
       one, true},
      {"temperature out of range", with("temperature", -1), RequestError::invalid_request, "temperature is -1", one,
       true},
      {"max_tokens zero", with("max_tokens", 0), RequestError::invalid_request, "max_tokens is 0", one, true},
      {"max_tokens over 32 bits", with("max_tokens", 1099511627776ll), RequestError::invalid_request,
       "max_tokens is 1099511627776", one, true},
      {"seed negative", with("seed", -1), RequestError::invalid_request, "seed is -1", one, true},
      {"top_logprobs without logprobs", with("top_logprobs", 2), RequestError::invalid_request, "top_logprobs", one,
       true},
      {"too many stop strings", with("stop", std::vector<std::string>(17, "s")), RequestError::invalid_request,
       "stop has 17 strings", one, true},
      {"logit_bias an array", with("logit_bias", {5, 1}), RequestError::malformed, "'logit_bias' must be a map", one,
       true},
      {"logit_bias with string keys", with("logit_bias", {{"5", 1}}), RequestError::malformed,
       "logit_bias has a key that is a string", one, true},
      {"logit_bias value a string", with_logit_bias(1, [](auto& p) { p.pack(5).pack("a"); }),
       RequestError::malformed, "'logit_bias[\"5\"]' must be a number", one, true},
      {"logit_bias over 100", with_logit_bias(1, [](auto& p) { p.pack(5).pack(101); }),
       RequestError::invalid_request, "logit_bias[\"5\"] is 101", one, true},
      {"logit_bias of a negative id", with_logit_bias(1, [](auto& p) { p.pack(-1).pack(1); }),
       RequestError::invalid_request, "logit_bias[\"-1\"] names token -1", one, true},
      {"logit_bias id twice", with_logit_bias(2, [](auto& p) { p.pack(5).pack(1).pack(5).pack(2); }),
       RequestError::invalid_request, "logit_bias[\"5\"] appears twice", one, true},
      {"stop not strings", with("stop", {"a", 1}), RequestError::malformed, "'stop[1]' must be a string", one, true},
      {"negative token", packed({{"op", "generate"}, {"id", 1}, {"tokens", {5, -1}}}), RequestError::invalid_request,
       "tokens[1] is -1", one, true},
      {"token a string", packed({{"op", "generate"}, {"id", 1}, {"tokens", {"a"}}}), RequestError::malformed,
       "'tokens[0]' must be an integer", one, true},
      {"too many tokens", packed({{"op", "generate"}, {"id", 1}, {"tokens", std::vector<int>(kMaxPromptTokens + 1, 1)}}),
       RequestError::invalid_request, "tokens has 262145 ids", one, true},
      {"message without content", packed({{"op", "generate"}, {"id", 1}, {"messages", {{{"role", "user"}}}}}),
       RequestError::malformed, "messages[0] lacks content", one, true},
      {"message with another key",
       packed({{"op", "generate"}, {"id", 1}, {"messages", {{{"role", "user"}, {"content", "a"}, {"weight", "b"}}}}}),
       RequestError::malformed, "'weight'", one, true},
      {"tool result without its call's id", chat({{{"role", "tool"}, {"content", "18 C"}}}),
       RequestError::invalid_request, "'messages[0].tool_call_id' is missing", one, true},
      {"user content nil", chat({{{"role", "user"}, {"content", nullptr}}}), RequestError::invalid_request,
       "'messages[0].content' is null", one, true},
      {"tool calls from a user", chat({{{"role", "user"}, {"content", "x"}, {"tool_calls", {call}}}}),
       RequestError::invalid_request, "'messages[0].tool_calls' is on a \"user\" message", one, true},
      {"tool calls not an array", chat({{{"role", "assistant"}, {"tool_calls", call}}}), RequestError::malformed,
       "'messages[0].tool_calls' must be an array", one, true},
      {"tool call without an id", chat({{{"role", "assistant"}, {"tool_calls", {without_key(call, "id")}}}}),
       RequestError::invalid_request, "'messages[0].tool_calls[0].id' is missing", one, true},
      {"tool call with a bad name", chat({{{"role", "assistant"}, {"tool_calls", {bad_name}}}}),
       RequestError::invalid_request, "'messages[0].tool_calls[0].function.name' is \"a b\"", one, true},
      {"tool call's arguments a map", chat({{{"role", "assistant"}, {"tool_calls", {map_arguments}}}}),
       RequestError::malformed, "'messages[0].tool_calls[0].function.arguments' must be a string", one, true},
      {"tool call without a function", chat({{{"role", "assistant"}, {"tool_calls", {without_key(call, "function")}}}}),
       RequestError::malformed, "messages[0].tool_calls[0] lacks function", one, true},
      {"tool call of another type", chat({{{"role", "assistant"}, {"tool_calls", {code_call}}}}),
       RequestError::invalid_request, "type must be \"function\"", one, true},
      {"tool call with another key", chat({{{"role", "assistant"}, {"tool_calls", {extra_key}}}}),
       RequestError::malformed, "other than id, type, function: 'index'", one, true},
      {"tools not JSON text", chat_with("tools", json::array()), RequestError::malformed,
       "'tools' must be a string", one, true},
      {"tools not JSON", chat_with("tools", "[{"), RequestError::invalid_request, "tools is not JSON", one, true},
      {"tools with a bad name", chat_with("tools", R"([{"type": "function", "function": {"name": "a b"}}])"),
       RequestError::invalid_request, "'tools[0].function.name' is \"a b\"", one, true},
      {"tools twice the same name",
       chat_with("tools", R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])"),
       RequestError::invalid_request, "'tools[1].function.name' is \"f\", the name of an earlier tool", one, true},
      {"tool_choice unknown", chat_with("tool_choice", "always"), RequestError::invalid_request,
       "'tool_choice' is \"always\"", one, true},
      {"tool_choice an integer", chat_with("tool_choice", 1), RequestError::malformed, "tool_choice must be", one, true},
      // client_protocol.fuzz: reading a type that is a number threw out of parse_request.
      {"tool_choice's type a number", chat_with("tool_choice", {{"type", 110}, {"function", {{"name", "get_weather"}}}}),
       RequestError::malformed, "tool_choice must be", one, true},
      {"tool_choice required without tools", chat_with("tool_choice", "required"), RequestError::invalid_request,
       "'tool_choice' is \"required\": give the tools", one, true},
      {"tool_choice names no tool", chat_with("tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}),
       RequestError::invalid_request, "'tool_choice' is a function", one, true},
      {"parallel_tool_calls a string", chat_with("parallel_tool_calls", "no"), RequestError::malformed,
       "'parallel_tool_calls' must be true or false", one, true},
      {"chat_template_kwargs an array", chat_with("chat_template_kwargs", {1}), RequestError::malformed,
       "'chat_template_kwargs' must be a map", one, true},
      {"chat_template_kwargs replacing messages", chat_with("chat_template_kwargs", {{"messages", 1}}),
       RequestError::invalid_request, "'chat_template_kwargs.messages' is set by the server", one, true},
      {"chat_template_kwargs not UTF-8", chat_with("chat_template_kwargs", {{"k", "\xff\xfe"}}),
       RequestError::invalid_request, "'chat_template_kwargs' holds a string that is not UTF-8", one, true},
      {"chat_template_kwargs with binary", chat_with_binary_kwargs(), RequestError::malformed,
       "chat_template_kwargs holds a value JSON has no type for", one, true},
      {"tools with a prompt", with("tools", R"([{"type": "function", "function": {"name": "f"}}])"),
       RequestError::invalid_request, "are for messages", one, true},
      {"message not a map", packed({{"op", "generate"}, {"id", 1}, {"messages", {"hi"}}}), RequestError::malformed,
       "'messages[0]' must be a map", one, true},
      {"no prompt", without("prompt"), RequestError::invalid_request, "no prompt", one, true},
      {"two prompts", with("tokens", {1}), RequestError::invalid_request, "several prompts", one, true},
      {"empty prompt", with("prompt", ""), RequestError::invalid_request, "prompt is empty", one, true},
      {"empty messages", packed({{"op", "generate"}, {"id", 1}, {"messages", json::array()}}),
       RequestError::invalid_request, "messages is empty", one, true},
      {"abort with another key", packed({{"op", "abort"}, {"id", 1}, {"now", true}}), RequestError::malformed,
       "abort has no key 'now'", one},
      {"abort without id", packed({{"op", "abort"}}), RequestError::malformed, "'id' is missing", std::nullopt},
      {"status trim not bool", packed({{"op", "status"}, {"trim", 1}}), RequestError::malformed,
       "'trim' must be true or false", std::nullopt},
      {"status with another key", packed({{"op", "status"}, {"id", 1}, {"verbose", true}}), RequestError::malformed,
       "status has no key 'verbose'", one},
      {"unknown op lists every op", with("op", "reload"), RequestError::malformed,
       "generate, abort, status, load, unload, models or clear_cache", one},
      {"no op lists every op", without("op"), RequestError::malformed,
       "generate, abort, status, load, unload, models or clear_cache", one},
      {"load without model", packed({{"op", "load"}, {"id", 1}}), RequestError::invalid_request,
       "load needs 'model'", one},
      {"load with an empty model", packed({{"op", "load"}, {"id", "e"}, {"model", ""}}), RequestError::invalid_request,
       "load needs 'model'", ClientId{std::string("e")}},
      {"load without model or id", packed({{"op", "load"}}), RequestError::invalid_request, "'model'", std::nullopt},
      {"unload without model", packed({{"op", "unload"}, {"id", 1}, {"if_idle", true}}),
       RequestError::invalid_request, "unload needs 'model'", one},
      {"load model not a string", packed({{"op", "load"}, {"id", 1}, {"model", 5}}), RequestError::malformed,
       "'model' must be a string, not an integer", one},
      {"load model too long", packed({{"op", "load"}, {"id", 1}, {"model", std::string(300, 'm')}}),
       RequestError::invalid_request, "model is 300 bytes", one},
      {"load model twice", raw_map(4, {"op", "load", "id", 1, "model", "a", "model", "b"}), RequestError::malformed,
       "'model' appears twice", one},
      {"load with another key", packed({{"op", "load"}, {"id", 1}, {"model", "a"}, {"path", "/x"}}),
       RequestError::malformed, "load has no key 'path'", one},
      {"load with if_idle", packed({{"op", "load"}, {"id", 1}, {"model", "a"}, {"if_idle", true}}),
       RequestError::malformed, "load has no key 'if_idle'", one},
      {"unload with another key", packed({{"op", "unload"}, {"id", 1}, {"model", "a"}, {"force", true}}),
       RequestError::malformed, "unload has no key 'force'", one},
      {"unload if_idle an integer", packed({{"op", "unload"}, {"id", 1}, {"model", "a"}, {"if_idle", 1}}),
       RequestError::malformed, "'if_idle' must be true or false, not an integer", one},
      {"unload if_idle a string", packed({{"op", "unload"}, {"model", "a"}, {"if_idle", "yes"}}),
       RequestError::malformed, "'if_idle' must be true or false, not a string", std::nullopt},
      {"models with another key", packed({{"op", "models"}, {"id", 1}, {"all", true}}), RequestError::malformed,
       "models has no key 'all'", one},
      {"models with if_idle", packed({{"op", "models"}, {"if_idle", true}}), RequestError::malformed,
       "models has no key 'if_idle'", std::nullopt},
      {"models model not a string", packed({{"op", "models"}, {"model", json::array()}}), RequestError::malformed,
       "'model' must be a string", std::nullopt},
      {"admin id an array", packed({{"op", "unload"}, {"id", {1}}, {"model", "a"}}), RequestError::malformed,
       "'id' must be a string or an integer", std::nullopt},
      {"clear_cache without tier", packed({{"op", "clear_cache"}, {"id", 1}}), RequestError::invalid_request,
       "clear_cache needs 'tier'", one},
      {"clear_cache of another tier", packed({{"op", "clear_cache"}, {"id", 1}, {"tier", "gpu"}}),
       RequestError::invalid_request, "tier is 'gpu'", one},
      {"clear_cache tier in capitals", packed({{"op", "clear_cache"}, {"tier", "HOT"}}), RequestError::invalid_request,
       "\"hot\" (RAM) or the \"ssd\" tier", std::nullopt},
      {"clear_cache tier a number", packed({{"op", "clear_cache"}, {"id", 1}, {"tier", 1}}), RequestError::malformed,
       "'tier' must be \"hot\" or \"ssd\", not an integer", one},
      {"clear_cache tier twice", raw_map(3, {"op", "clear_cache", "tier", "hot", "tier", "ssd"}),
       RequestError::malformed, "'tier' appears twice", std::nullopt},
      {"clear_cache with a model", packed({{"op", "clear_cache"}, {"id", 1}, {"tier", "hot"}, {"model", "a"}}),
       RequestError::malformed, "clear_cache has no key 'model'", one},
      {"clear_cache id a map", packed({{"op", "clear_cache"}, {"id", {{"a", 1}}}, {"tier", "hot"}}),
       RequestError::malformed, "'id' must be a string or an integer", std::nullopt},
  };
}

TEST(ClientProtocolTest, EveryBadFrameIsAnErrorValueNamingTheProblem) {
  for (const BadFrame& bad : bad_frames()) {
    SCOPED_TRACE(bad.name);
    auto parsed = parse_bytes(bad.bytes);
    auto* problem = std::get_if<RequestProblem>(&parsed);
    ASSERT_NE(problem, nullptr);
    EXPECT_EQ(front_end::error_code_name(problem->code), front_end::error_code_name(bad.code));
    EXPECT_NE(problem->message.find(bad.mentions), std::string::npos) << problem->message;
    EXPECT_EQ(problem->id, bad.id);
    EXPECT_EQ(problem->generate, bad.generate);
  }
}

// Random edits of good frames: every result is a request that validates or a problem that says
// something, never a crash (the sanitizer builds make this test bite).
TEST(ClientProtocolTest, MutatedFramesAreRequestsOrProblemsNeverCrashes) {
  const std::vector<std::string> seeds = {
      packed({{"op", "generate"}, {"id", "a"}, {"prompt", "Hello"}, {"temperature", 0.7}, {"stop", {"x", "y"}},
              {"stop_token_ids", {1, 2}}, {"logprobs", true}, {"top_logprobs", 2}, {"seed", 99}}),
      packed({{"op", "generate"}, {"id", 7}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"stream", false}}),
      packed({{"op", "generate"}, {"id", -1}, {"tokens", {1, 300, 70000}}, {"max_tokens", 4}}),
      packed({{"op", "abort"}, {"id", "a"}}),
      packed({{"op", "status"}, {"id", 3}, {"trim", true}}),
      packed({{"op", "load"}, {"id", 4}, {"model", "qwen"}}),
      packed({{"op", "unload"}, {"id", "u"}, {"model", "qwen"}, {"if_idle", true}}),
      packed({{"op", "models"}, {"model", "qwen"}}),
      packed({{"op", "clear_cache"}, {"id", 5}, {"tier", "ssd"}}),
  };
  std::mt19937 rng(20240611);
  int requests = 0;
  for (int i = 0; i < 50000; ++i) {
    std::string bytes = seeds[i % seeds.size()];
    for (int edits = 1 + static_cast<int>(rng() % 4); edits > 0 && !bytes.empty(); --edits) {
      std::size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0: bytes[at] = static_cast<char>(rng()); break;
        case 1: bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(rng())); break;
        case 2: bytes.erase(at, 1); break;
        default: bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8))); break;
      }
    }
    auto parsed = parse_bytes(bytes);
    if (auto* problem = std::get_if<RequestProblem>(&parsed)) {
      ASSERT_FALSE(problem->message.empty());
    } else if (auto* generate = std::get_if<GenerateRequest>(&parsed)) {
      ++requests;
      ASSERT_FALSE(model::validate(generate->submit.sampling).has_value());
    } else {
      ++requests;
    }
  }
  EXPECT_GT(requests, 0);  // some edits leave a good request (a changed letter of the prompt)
}

TEST(ClientProtocolTest, TokenEventCarriesIdTokensTextAndLogprobs) {
  messages::TokenEvent event{{5, 6}, "Hi", {{5, -0.25f, {5, 9}, {-0.25f, -2.0f}}, {6, -0.5f, {}, {}}}};
  json plain = read(encode_token_event(ClientId{std::string("a")}, event, false));
  EXPECT_EQ(plain, (json{{"event", "token"}, {"id", "a"}, {"tokens", {5, 6}}, {"text", "Hi"}}));

  json with = read(encode_token_event(ClientId{std::int64_t{3}}, event, true));
  EXPECT_EQ(with["id"], 3);
  ASSERT_EQ(with["logprobs"].size(), 2u);
  EXPECT_EQ(with["logprobs"][0]["token"], 5);
  EXPECT_DOUBLE_EQ(with["logprobs"][0]["logprob"].get<double>(), -0.25);
  EXPECT_EQ(with["logprobs"][0]["top"], (json{{5, -0.25}, {9, -2.0}}));
  EXPECT_EQ(with["logprobs"][1]["top"], json::array());
}

TEST(ClientProtocolTest, EventsCarryReasoningAndToolCalls) {
  messages::TokenEvent event{{5}, "", {}};
  event.reasoning = "hmm";
  event.tool_calls = {{0, "call_a", "f", "{\"x\""}, {0, "", "", ": 1}"}};
  json token = read(encode_token_event(ClientId{std::int64_t{1}}, event, false));
  EXPECT_EQ(token["reasoning"], "hmm");
  EXPECT_EQ(token["tool_calls"], json::parse(R"([{"index": 0, "id": "call_a", "name": "f", "arguments": "{\"x\""},
                                                 {"index": 0, "arguments": ": 1}"}])"));
  // Not streaming: the final has the calls whole, the final's own pieces joined on.
  front_end::GatheredOutput gathered;
  gathered.append(event);
  messages::FinalEvent final_event;
  final_event.finish = static_cast<std::uint8_t>(messages::FinishReason::tool_calls);
  final_event.tool_calls = {{0, "", "", "}"}, {1, "call_b", "g", "{}"}};
  json final_json = read(encode_final_event(ClientId{std::int64_t{1}}, final_event, gathered, false));
  EXPECT_EQ(final_json["finish_reason"], "tool_calls");
  EXPECT_EQ(final_json["reasoning"], "hmm");
  EXPECT_EQ(final_json["tool_calls"], json::parse(R"([{"index": 0, "id": "call_a", "name": "f", "arguments": "{\"x\": 1}}"},
                                                      {"index": 1, "id": "call_b", "name": "g", "arguments": "{}"}])"));
  // Without them, neither key.
  json plain = read(encode_token_event(ClientId{std::int64_t{1}}, messages::TokenEvent{{5}, "a", {}}, false));
  EXPECT_FALSE(plain.contains("reasoning"));
  EXPECT_FALSE(plain.contains("tool_calls"));
}

TEST(ClientProtocolTest, FinalEventJoinsGatheredOutputAndConvertsTimings) {
  messages::FinalEvent event;
  event.finish = static_cast<std::uint8_t>(messages::FinishReason::stop);
  event.text = "!";
  event.stop = "END";
  event.prompt_tokens = 4;
  event.completion_tokens = 3;
  event.cached_tokens = 2;
  event.queue_ns = 1'500'000;
  event.ttft_ns = 2'000'000;
  event.total_ns = 12'250'000;
  front_end::GatheredOutput gathered;
  gathered.append({{7}, "Hel", {{7, -0.5f, {}, {}}}});
  gathered.append({{8, 9}, "lo", {{8, -1.0f, {}, {}}, {9, -1.5f, {}, {}}}});
  json final_event = read(encode_final_event(ClientId{std::string("r")}, event, gathered, true));
  EXPECT_EQ(final_event["event"], "final");
  EXPECT_EQ(final_event["id"], "r");
  EXPECT_EQ(final_event["finish_reason"], "stop");
  EXPECT_EQ(final_event["text"], "Hello!");
  EXPECT_EQ(final_event["tokens"], (json{7, 8, 9}));
  EXPECT_EQ(final_event["logprobs"].size(), 3u);
  EXPECT_EQ(final_event["stop"], "END");
  EXPECT_EQ(final_event["usage"], (json{{"prompt_tokens", 4}, {"completion_tokens", 3}, {"cached_tokens", 2}}));
  EXPECT_DOUBLE_EQ(final_event["timings"]["queue_ms"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(final_event["timings"]["ttft_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(final_event["timings"]["total_ms"].get<double>(), 12.25);
  EXPECT_FALSE(final_event.contains("error"));
  EXPECT_FALSE(final_event.contains("embedding"));

  json failed = read(encode_final_event(ClientId{std::int64_t{1}}, front_end::error_final(RequestError::busy, "try later"), {}, false));
  EXPECT_EQ(failed["finish_reason"], "error");
  EXPECT_EQ(failed["error"], (json{{"code", "busy"}, {"message", "try later"}}));
  EXPECT_EQ(failed["tokens"], json::array());
  EXPECT_FALSE(failed.contains("logprobs"));
  EXPECT_FALSE(failed.contains("stop"));
}

TEST(ClientProtocolTest, ErrorAndStatusEvents) {
  EXPECT_EQ(read(encode_error_event(RequestError::malformed, "bad", std::nullopt)),
            (json{{"event", "error"}, {"code", "malformed"}, {"message", "bad"}}));
  EXPECT_EQ(read(encode_error_event(RequestError::unavailable, "gone", ClientId{std::int64_t{4}})),
            (json{{"event", "error"}, {"id", 4}, {"code", "unavailable"}, {"message", "gone"}}));

  messages::StatusReport report;
  report.models = {"m"};
  report.requests = 3;
  report.waiting = 1;
  report.running = 2;
  report.steps = 100;
  report.finished = 7;
  report.preemptions = 1;
  report.computed_tokens = 1000;
  report.prefix_hit_tokens = 50;
  report.restored_hot_tokens = 32;
  report.restored_ssd_tokens = 16;
  report.spilled_pages = 9;
  report.drafted_tokens = 40;
  report.accepted_tokens = 25;
  report.kv_pages = 64;
  report.kv_pages_in_use = 10;
  report.kv_pages_cached = 4;
  report.kv_references = 12;
  report.executor_slots = 2;
  report.executor_ready = true;
  report.pool = {1024, 2048, 4096, 8192, 3, {{"kv", 512}, {"weights:m", 512}}};
  json status = read(encode_status_event(ClientId{std::string("s")}, report, {5, 2}));
  EXPECT_EQ(status, (json{{"event", "status"},
                          {"id", "s"},
                          {"models", {"m"}},
                          {"requests", 3},
                          {"waiting", 1},
                          {"running", 2},
                          {"steps", 100},
                          {"finished", 7},
                          {"preemptions", 1},
                          {"computed_tokens", 1000},
                          {"prefix_hit_tokens", 50},
                          {"restored_hot_tokens", 32},
                          {"restored_ssd_tokens", 16},
                          {"spilled_pages", 9},
                          {"drafted_tokens", 40},
                          {"accepted_tokens", 25},
                          {"kv_pages", 64},
                          {"kv_pages_in_use", 10},
                          {"kv_pages_cached", 4},
                          {"kv_references", 12},
                          {"executor_slots", 2},
                          {"executor_ready", true},
                          {"pool",
                           {{"active_bytes", 1024},
                            {"cached_bytes", 2048},
                            {"peak_active_bytes", 4096},
                            {"held_bytes", 8192},
                            {"blocks", 3},
                            {"active_by_owner", {{"kv", 512}, {"weights:m", 512}}}}},
                          {"gateway_requests", 5},
                          {"curve_refused", 2}}));
  EXPECT_FALSE(read(encode_status_event(std::nullopt, report, {})).contains("id"));
}

// The keys of an event's top map in the order packed, read with msgpack-c: a count in the map's
// header that disagrees with its entries, or a key packed twice, shows here and not in a json.
std::vector<std::string> packed_keys(const std::string& event) {
  msgpack::object_handle handle = msgpack::unpack(event.data(), event.size());
  const msgpack::object& root = handle.get();
  EXPECT_EQ(root.type, msgpack::type::MAP);
  std::vector<std::string> keys;
  if (root.type != msgpack::type::MAP) return keys;
  for (std::uint32_t i = 0; i < root.via.map.size; ++i) keys.push_back(root.via.map.ptr[i].key.as<std::string>());
  return keys;
}

// The msgpack type of `key`'s value in an event's top map; NIL when the key is absent.
msgpack::type::object_type packed_type(const std::string& event, std::string_view key) {
  msgpack::object_handle handle = msgpack::unpack(event.data(), event.size());
  const msgpack::object& root = handle.get();
  for (std::uint32_t i = 0; root.type == msgpack::type::MAP && i < root.via.map.size; ++i) {
    if (root.via.map.ptr[i].key.as<std::string>() == key) return root.via.map.ptr[i].val.type;
  }
  return msgpack::type::NIL;
}

TEST(ClientProtocolTest, JsonEventsCarryEventIdAndFields) {
  const json fields = {{"model", "qwen"}, {"state", "loaded"}, {"bytes", 123456789012ull}, {"evicted", {"b"}}};
  json numbered = read(encode_json_event("loaded", ClientId{std::int64_t{42}}, fields));
  EXPECT_EQ(numbered, (json{{"event", "loaded"},
                            {"id", 42},
                            {"model", "qwen"},
                            {"state", "loaded"},
                            {"bytes", 123456789012ull},
                            {"evicted", {"b"}}}));

  const std::string named = encode_json_event("unloaded", ClientId{std::string("u-1")}, fields);
  EXPECT_EQ(read(named)["id"], "u-1");
  EXPECT_EQ(read(named)["event"], "unloaded");
  EXPECT_EQ(packed_type(named, "id"), msgpack::type::STR);

  // An integer id stays an integer, as the client gave it.
  const std::string negative = encode_json_event("models", ClientId{std::int64_t{-3}}, json::object());
  EXPECT_EQ(read(negative), (json{{"event", "models"}, {"id", -3}}));
  EXPECT_EQ(packed_type(negative, "id"), msgpack::type::NEGATIVE_INTEGER);
  EXPECT_EQ(packed_type(encode_json_event("loaded", ClientId{std::int64_t{42}}, fields), "id"),
            msgpack::type::POSITIVE_INTEGER);

  json anonymous = read(encode_json_event("models", std::nullopt, {{"models", json::array()}}));
  EXPECT_EQ(anonymous, (json{{"event", "models"}, {"models", json::array()}}));
}

messages::ModelsReport memory_report() {
  messages::ModelsReport memory;
  messages::ModelStatus a;
  a.id = "a";
  a.path = "/models/a.gguf";
  a.pinned = true;
  a.state = static_cast<std::uint8_t>(messages::ModelState::loaded);
  a.bytes = 3000;
  a.estimated_bytes = 3100;
  a.requests = 2;
  a.loads = 1;
  messages::ModelStatus b;
  b.id = "b";
  b.state = static_cast<std::uint8_t>(messages::ModelState::draining);
  b.bytes = 500;
  b.unloads = 4;
  b.last_problem = "release of kv failed";
  messages::ModelStatus c;
  c.id = "c";
  memory.models = {a, b, c};
  memory.ceiling_bytes = 10000;
  memory.soft_bytes = 8000;
  memory.hard_bytes = 9500;
  memory.used_bytes = 3500;
  memory.pressure = static_cast<std::uint8_t>(messages::Pressure::soft);
  memory.pressure_note = "every loaded model is pinned";
  memory.pool.held_bytes = 4096;
  memory.pool.active_bytes = 3500;
  memory.pool.cached_bytes = 596;
  memory.pool.blocks = 2;
  return memory;
}

TEST(ClientProtocolTest, StatusEventCarriesTheMemoryPictureOnlyWhenGiven) {
  messages::StatusReport report;
  report.models = {"a"};
  report.requests = 2;
  report.pool = {1, 2, 3, 4, 5, {{"weights:a", 1}}};
  const messages::ModelsReport memory = memory_report();

  const std::string with_bytes = encode_status_event(ClientId{std::int64_t{8}}, report, {3, 0}, &memory);
  const std::vector<std::string> keys = packed_keys(with_bytes);
  EXPECT_EQ(keys.size(), 26u);  // 24 fields, event and id
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size()) << "a key packed twice";
  json with = read(with_bytes);
  EXPECT_EQ(with.size(), 26u);
  EXPECT_EQ(with["event"], "status");
  EXPECT_EQ(with["id"], 8);
  ASSERT_TRUE(with.contains("memory"));
  const json& picture = with["memory"];
  EXPECT_EQ(picture["ceiling_bytes"], 10000);
  EXPECT_EQ(picture["soft_bytes"], 8000);
  EXPECT_EQ(picture["hard_bytes"], 9500);
  EXPECT_EQ(picture["used_bytes"], 3500);
  EXPECT_EQ(picture["pressure"], "soft");
  EXPECT_EQ(picture["pressure_note"], "every loaded model is pinned");
  EXPECT_EQ(picture["pool"], (json{{"held_bytes", 4096}, {"active_bytes", 3500}, {"cached_bytes", 596}, {"blocks", 2}}));
  ASSERT_EQ(picture["models"].size(), 3u);
  EXPECT_EQ(picture["models"][0]["id"], "a");
  EXPECT_EQ(picture["models"][0]["state"], "loaded");
  EXPECT_EQ(picture["models"][0]["pinned"], true);
  EXPECT_EQ(picture["models"][0]["bytes"], 3000);
  EXPECT_EQ(picture["models"][0]["requests"], 2);
  EXPECT_EQ(picture["models"][1]["state"], "draining");
  EXPECT_EQ(picture["models"][1]["last_problem"], "release of kv failed");
  EXPECT_EQ(picture["models"][2]["state"], "unloaded");
  for (const json& model : picture["models"]) EXPECT_TRUE(model["state"].is_string()) << model;

  // Everything else is the event without memory.
  const std::string without_bytes = encode_status_event(ClientId{std::int64_t{8}}, report, {3, 0});
  EXPECT_EQ(packed_keys(without_bytes).size(), 25u);
  json without = read(without_bytes);
  EXPECT_FALSE(without.contains("memory"));
  with.erase("memory");
  EXPECT_EQ(with, without);

  // No id: 24 fields and event.
  EXPECT_EQ(packed_keys(encode_status_event(std::nullopt, report, {}, &memory)).size(), 25u);
}

}  // namespace
}  // namespace mqlm::actors::client_protocol
