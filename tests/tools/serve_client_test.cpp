// The client's request encoding against docs/protocol.md, its event decoding against good and
// malformed frames, and its socket against a stand-in ROUTER.
#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/tools/fake_server.hpp"
#include "tools/serve_client.hpp"

namespace mqlm::tools {
namespace {

using ::testing::HasSubstr;
using fake_serving::FakeServer;
using fake_serving::pack_map;
using fake_serving::RequestMap;

std::span<const std::byte> bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// ---- requests -------------------------------------------------------------------------------

TEST(ServeClientEncoding, GenerateCarriesEveryKeyOfTheProtocolWithItsType) {
  GenerateRequest r;
  r.id = std::int64_t{42};
  r.model = "tiny";
  r.prompt = std::string("Once upon a time");
  r.stream = false;
  r.sampling.max_tokens = 16;
  r.sampling.temperature = 0.5f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.9f;
  r.sampling.min_p = 0.05f;
  r.sampling.repetition_penalty = 1.1f;
  r.sampling.repetition_last_n = 32;
  r.sampling.presence_penalty = 0.25f;
  r.sampling.frequency_penalty = -0.5f;
  r.sampling.seed = 7;
  r.sampling.stop = {"\n\n", "END"};
  r.sampling.stop_token_ids = {2, 3};
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 5;
  r.sampling.logit_bias = {{50256, -100.0f}, {9, 1.5f}};
  const std::string frame = encode_generate(r);
  RequestMap m(frame);

  // Exactly the keys of the table in docs/protocol.md, one prompt key among them.
  std::set<std::string> keys;
  for (const auto& [key, value] : m.keys) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"op", "id", "model", "prompt", "stream", "max_tokens", "temperature",
                                         "top_k", "top_p", "min_p", "repetition_penalty", "repetition_last_n",
                                         "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids",
                                         "logprobs", "top_logprobs", "logit_bias"}));
  auto type = [&](const std::string& key) { return m.keys.at(key).type; };
  EXPECT_EQ(type("op"), msgpack::type::STR);
  EXPECT_EQ(m.get<std::string>("op"), "generate");
  EXPECT_EQ(type("id"), msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(m.get<std::int64_t>("id"), 42);
  EXPECT_EQ(m.get<std::string>("model"), "tiny");
  EXPECT_EQ(m.get<std::string>("prompt"), "Once upon a time");
  EXPECT_EQ(type("stream"), msgpack::type::BOOLEAN);
  EXPECT_FALSE(m.get<bool>("stream"));
  for (const char* key : {"max_tokens", "top_k", "repetition_last_n", "seed", "top_logprobs"}) {
    EXPECT_EQ(type(key), msgpack::type::POSITIVE_INTEGER) << key;
  }
  EXPECT_EQ(m.get<std::int32_t>("max_tokens"), 16);
  EXPECT_EQ(m.get<std::int32_t>("top_k"), 40);
  EXPECT_EQ(m.get<std::int32_t>("repetition_last_n"), 32);
  EXPECT_EQ(m.get<std::uint64_t>("seed"), 7u);
  EXPECT_EQ(m.get<std::int32_t>("top_logprobs"), 5);
  for (const char* key :
       {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}) {
    EXPECT_EQ(type(key), msgpack::type::FLOAT64) << key;
  }
  EXPECT_FLOAT_EQ(m.get<float>("temperature"), 0.5f);
  EXPECT_FLOAT_EQ(m.get<float>("top_p"), 0.9f);
  EXPECT_FLOAT_EQ(m.get<float>("min_p"), 0.05f);
  EXPECT_FLOAT_EQ(m.get<float>("repetition_penalty"), 1.1f);
  EXPECT_FLOAT_EQ(m.get<float>("presence_penalty"), 0.25f);
  EXPECT_FLOAT_EQ(m.get<float>("frequency_penalty"), -0.5f);
  EXPECT_EQ(m.get<std::vector<std::string>>("stop"), (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(m.get<std::vector<std::int32_t>>("stop_token_ids"), (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(type("logprobs"), msgpack::type::BOOLEAN);
  EXPECT_TRUE(m.get<bool>("logprobs"));
  EXPECT_EQ(type("logit_bias"), msgpack::type::MAP);
  EXPECT_EQ((m.get<std::map<std::int32_t, double>>("logit_bias")), (std::map<std::int32_t, double>{{9, 1.5}, {50256, -100.0}}));
}

TEST(ServeClientEncoding, TokenPromptsAndStringIdsAndNoModel) {
  GenerateRequest r;
  r.id = std::string("req-1");
  r.prompt = std::vector<std::int32_t>{1, 2, 300};
  RequestMap m(encode_generate(r));
  EXPECT_FALSE(m.has("model"));  // the server's default model
  EXPECT_FALSE(m.has("prompt"));
  EXPECT_FALSE(m.has("messages"));
  EXPECT_EQ(m.keys.at("id").type, msgpack::type::STR);
  EXPECT_EQ(m.get<std::string>("id"), "req-1");
  EXPECT_EQ(m.get<std::vector<std::int32_t>>("tokens"), (std::vector<std::int32_t>{1, 2, 300}));
  EXPECT_TRUE(m.get<bool>("stream"));
  // Defaults go out as the protocol's defaults.
  EXPECT_EQ(m.get<std::int32_t>("max_tokens"), 256);
  EXPECT_FLOAT_EQ(m.get<float>("temperature"), 1.0f);
  EXPECT_TRUE(m.get<std::vector<std::string>>("stop").empty());
  EXPECT_FALSE(m.has("logit_bias"));  // sent only when set
  EXPECT_FALSE(m.has("draft_max"));   // so is draft_max
  r.draft_max = 0;
  EXPECT_EQ(RequestMap(encode_generate(r)).get<std::int32_t>("draft_max"), 0);
}

TEST(ServeClientEncoding, ChatMessagesAreRoleContentMaps) {
  GenerateRequest r;
  r.id = std::int64_t{-3};
  r.prompt = std::vector<ChatMessage>{{"system", "Be brief."}, {"user", "Hi"}};
  RequestMap m(encode_generate(r));
  EXPECT_EQ(m.keys.at("id").type, msgpack::type::NEGATIVE_INTEGER);
  const msgpack::object& messages = m.keys.at("messages");
  ASSERT_EQ(messages.type, msgpack::type::ARRAY);
  ASSERT_EQ(messages.via.array.size, 2u);
  std::map<std::string, std::string> second;
  messages.via.array.ptr[1].convert(second);
  EXPECT_EQ(second, (std::map<std::string, std::string>{{"role", "user"}, {"content", "Hi"}}));
  std::map<std::string, std::string> first;
  messages.via.array.ptr[0].convert(first);
  EXPECT_EQ(first.at("role"), "system");
  EXPECT_EQ(first.at("content"), "Be brief.");
}

TEST(ServeClientEncoding, AbortAndStatus) {
  RequestMap abort(encode_abort(std::int64_t{9}));
  EXPECT_EQ(abort.keys.size(), 2u);
  EXPECT_EQ(abort.get<std::string>("op"), "abort");
  EXPECT_EQ(abort.get<std::int64_t>("id"), 9);

  RequestMap plain(encode_status({}));
  EXPECT_EQ(plain.keys.size(), 1u);
  EXPECT_EQ(plain.get<std::string>("op"), "status");

  RequestMap full(encode_status({std::string("s"), true, {}}));
  EXPECT_EQ(full.keys.size(), 3u);
  EXPECT_EQ(full.get<std::string>("id"), "s");
  EXPECT_TRUE(full.get<bool>("trim"));
}

// ---- events ---------------------------------------------------------------------------------

ServeEvent decoded(const std::string& frame) {
  auto result = decode_event(bytes(frame));
  if (auto* bad = std::get_if<BadEvent>(&result)) ADD_FAILURE() << "bad event: " << bad->reason;
  return std::get<ServeEvent>(std::move(result));
}

std::string bad_reason(const std::string& frame) {
  auto result = decode_event(bytes(frame));
  if (std::holds_alternative<ServeEvent>(result)) {
    ADD_FAILURE() << "decoded a frame that should be rejected";
    return {};
  }
  return std::get<BadEvent>(result).reason;
}

TEST(ServeClientDecoding, TokenEventWithLogprobs) {
  const std::string frame = pack_map(5, [](auto& p) {
    p.pack("event"), p.pack("token");
    p.pack("id"), p.pack(7);
    p.pack("tokens"), p.pack(std::vector<int>{11, 12});
    p.pack("text"), p.pack("hé");
    p.pack("logprobs");
    p.pack_array(1);
    p.pack_map(3);
    p.pack("token"), p.pack(11);
    p.pack("logprob"), p.pack(-0.25f);
    p.pack("top");
    p.pack_array(2);
    p.pack_array(2), p.pack(11), p.pack(-0.25f);
    p.pack_array(2), p.pack(4), p.pack(-1.5);
  });
  ServeEvent e = decoded(frame);
  EXPECT_EQ(e.kind, EventKind::token);
  EXPECT_EQ(e.id, RequestId{std::int64_t{7}});
  EXPECT_EQ(e.tokens, (std::vector<std::int32_t>{11, 12}));
  EXPECT_EQ(e.text, "hé");
  ASSERT_EQ(e.logprobs.size(), 1u);
  EXPECT_EQ(e.logprobs[0].token, 11);
  EXPECT_DOUBLE_EQ(e.logprobs[0].logprob, -0.25);
  ASSERT_EQ(e.logprobs[0].top.size(), 2u);
  EXPECT_EQ(e.logprobs[0].top[1].first, 4);
  EXPECT_DOUBLE_EQ(e.logprobs[0].top[1].second, -1.5);
  EXPECT_EQ(e.fields["text"], "hé");
}

TEST(ServeClientDecoding, FinalEventWithUsageTimingsAndError) {
  const std::string frame = pack_map(8, [](auto& p) {
    p.pack("event"), p.pack("final");
    p.pack("id"), p.pack("abc");
    p.pack("finish_reason"), p.pack("error");
    p.pack("text"), p.pack("");
    p.pack("stop"), p.pack("\n");
    p.pack("usage");
    p.pack_map(3);
    p.pack("prompt_tokens"), p.pack(5);
    p.pack("completion_tokens"), p.pack(3);
    p.pack("cached_tokens"), p.pack(0);
    p.pack("timings");
    p.pack_map(3);
    p.pack("queue_ms"), p.pack(0.5);
    p.pack("ttft_ms"), p.pack(12.25);
    p.pack("total_ms"), p.pack(40);
    p.pack("error");
    p.pack_map(2);
    p.pack("code"), p.pack("gpu");
    p.pack("message"), p.pack("the step failed");
  });
  ServeEvent e = decoded(frame);
  EXPECT_EQ(e.kind, EventKind::final);
  EXPECT_EQ(e.id, RequestId{std::string("abc")});
  EXPECT_EQ(e.finish_reason, FinishReason::error);
  EXPECT_EQ(e.stop, "\n");
  ASSERT_TRUE(e.usage);
  EXPECT_EQ(e.usage->prompt_tokens, 5);
  EXPECT_EQ(e.usage->completion_tokens, 3);
  ASSERT_TRUE(e.timings);
  EXPECT_DOUBLE_EQ(e.timings->ttft_ms, 12.25);
  EXPECT_DOUBLE_EQ(e.timings->total_ms, 40);  // an integer is a number too
  EXPECT_EQ(e.error_code, "gpu");
  EXPECT_EQ(e.error_message, "the step failed");
}

TEST(ServeClientDecoding, ErrorAndStatusEvents) {
  ServeEvent error = decoded(pack_map(3, [](auto& p) {
    p.pack("event"), p.pack("error");
    p.pack("code"), p.pack("malformed");
    p.pack("message"), p.pack("unknown op");
  }));
  EXPECT_EQ(error.kind, EventKind::error);
  EXPECT_FALSE(error.id);
  EXPECT_EQ(error.error_code, "malformed");
  EXPECT_EQ(error.error_message, "unknown op");

  ServeEvent status = decoded(pack_map(4, [](auto& p) {
    p.pack("event"), p.pack("status");
    p.pack("models"), p.pack(std::vector<std::string>{"tiny"});
    p.pack("running"), p.pack(2);
    p.pack("pool");
    p.pack_map(1);
    p.pack("active_by_owner");
    p.pack_map(1);
    p.pack("kv"), p.pack(4096);
  }));
  EXPECT_EQ(status.kind, EventKind::status);
  EXPECT_EQ(status.fields["running"], 2);
  EXPECT_EQ(status.fields["pool"]["active_by_owner"]["kv"], 4096);
  EXPECT_EQ(status.fields["models"][0], "tiny");
}

// A final event with these extra pairs (on top of event and id).
template <typename Fill>
std::string final_with(std::uint32_t extra, Fill fill) {
  return pack_map(2 + extra, [&](auto& p) {
    p.pack("event"), p.pack("final");
    p.pack("id"), p.pack(1);
    fill(p);
  });
}

// A token event with one more key.
template <typename Value>
std::string token_with(const char* key, const Value& value) {
  return pack_map(3, [&](auto& p) {
    p.pack("event"), p.pack("token");
    p.pack("id"), p.pack(1);
    p.pack(key), p.pack(value);
  });
}

// A status event with one more pair.
template <typename Fill>
std::string status_with(Fill fill) {
  return pack_map(2, [&](auto& p) {
    p.pack("event"), p.pack("status");
    fill(p);
  });
}

TEST(ServeClientDecoding, AFinalOfToolCallsKeepsItsCallsAmongTheFields) {
  const ServeEvent e = decoded(final_with(2, [](auto& p) {
    p.pack("finish_reason"), p.pack("tool_calls");
    p.pack("tool_calls"), p.pack_array(1), p.pack_map(2), p.pack("index"), p.pack(0), p.pack("arguments"), p.pack("{}");
  }));
  EXPECT_EQ(e.finish_reason, FinishReason::tool_calls);
  EXPECT_EQ(to_string(*e.finish_reason), "tool_calls");
  EXPECT_EQ(e.fields["tool_calls"][0]["arguments"], "{}");
}

TEST(ServeClientDecoding, MalformedFramesAreErrorValuesThatSayWhy) {
  const std::string status = pack_map(1, [](auto& p) { p.pack("event"), p.pack("status"); });
  struct Case {
    const char* what;
    std::string frame;
    const char* reason;
  };
  const Case cases[] = {
      {"empty", "", "an empty frame"},
      {"a byte msgpack never uses", "\xc1", "parse error"},
      {"a map of two cut after its first key", std::string("\x82\xa5" "event", 7), "truncated"},
      {"an array", "\x93\x01\x02\x03", "not a msgpack map"},
      {"two maps in one frame", status + status, "trailing bytes"},
      {"no event key", pack_map(1, [](auto& p) { p.pack("id"), p.pack(1); }), "without 'event'"},
      {"event not a string", pack_map(1, [](auto& p) { p.pack("event"), p.pack(3); }), "'event' is number"},
      {"unknown event", pack_map(1, [](auto& p) { p.pack("event"), p.pack("party"); }), "unknown event 'party'"},
      {"token without id", pack_map(1, [](auto& p) { p.pack("event"), p.pack("token"); }), "token event without 'id'"},
      {"tokens a string", token_with("tokens", "12"), "'tokens' is string"},
      {"a negative token", token_with("tokens", std::vector<std::int64_t>{1, -2}), "tokens[1] = -2"},
      {"a token beyond 32 bits", token_with("tokens", std::vector<std::int64_t>{std::int64_t{1} << 40}),
       "is above 2147483647"},
      {"a float token", token_with("tokens", std::vector<double>{1.5}), "not an integer"},
      {"text a number", token_with("text", 5), "'text' is number"},
      {"logprobs of numbers", token_with("logprobs", std::vector<int>{1}), "logprobs[0] is not a map"},
      {"a final without finish_reason", final_with(0, [](auto&) {}), "without 'finish_reason'"},
      {"an unknown finish_reason", final_with(1, [](auto& p) { p.pack("finish_reason"), p.pack("bored"); }),
       "unknown finish_reason 'bored'"},
      {"negative usage", final_with(2, [](auto& p) {
         p.pack("finish_reason"), p.pack("stop");
         p.pack("usage"), p.pack_map(1), p.pack("prompt_tokens"), p.pack(-1);
       }),
       "usage.prompt_tokens = -1"},
      {"a key that is not a string", status_with([](auto& p) { p.pack(7), p.pack(1); }), "not a string"},
      {"a key twice", status_with([](auto& p) { p.pack("event"), p.pack("status"); }), "appears twice"},
      {"a binary value", status_with([](auto& p) { p.pack("blob"), p.pack_bin(2), p.pack_bin_body("ab", 2); }),
       "binary value"},
  };
  for (const Case& c : cases) EXPECT_THAT(bad_reason(c.frame), HasSubstr(c.reason)) << c.what;
}

TEST(ServeClientDecoding, HostileFramesCostNoMoreThanTheirSize) {
  // A million arrays nested in a megabyte; four billion elements declared in a hundred bytes.
  EXPECT_THAT(bad_reason(std::string("\x81\xa5" "event") + std::string(1'000'000, '\x91')), HasSubstr("depth"));
  EXPECT_THAT(bad_reason(std::string("\xdd\xff\xff\xff\xff", 5) + std::string(100, '\x01')),
              HasSubstr("more elements than it has bytes"));
  EXPECT_THAT(bad_reason(std::string(kMaxEventBytes + 1, '\x80')), HasSubstr("above the limit"));
}

// ---- the socket -----------------------------------------------------------------------------

ServeClient connected(const std::string& endpoint) {
  auto result = ServeClient::connect(endpoint);
  if (auto* why = std::get_if<std::string>(&result)) ADD_FAILURE() << *why;
  return std::move(std::get<ServeClient>(result));
}

const std::string kStatusEvent = pack_map(2, [](auto& p) {
  p.pack("event"), p.pack("status");
  p.pack("running"), p.pack(0);
});

TEST(ServeClientSocket, AnEndpointZeroMqCannotUseIsAnErrorValue) {
  auto result = ServeClient::connect("nonsense");
  ASSERT_TRUE(std::holds_alternative<std::string>(result));
  EXPECT_NE(std::get<std::string>(result).find("nonsense"), std::string::npos);
}

TEST(ServeClientSocket, RequestsArriveAsOneFrameAndKeepalivesAreSkipped) {
  FakeServer server;
  ServeClient client = connected(server.endpoint());
  GenerateRequest request;
  request.id = std::int64_t{5};
  request.prompt = std::string("hi");
  ASSERT_TRUE(client.send_generate(request));
  auto from = server.receive(std::chrono::seconds(5));
  ASSERT_TRUE(from);
  EXPECT_EQ(from->frame, encode_generate(request));

  server.send(from->routing_id, {""});
  server.send(from->routing_id, {""});
  server.send(from->routing_id, {kStatusEvent});
  Received received = client.receive(std::chrono::seconds(5));
  ASSERT_TRUE(std::holds_alternative<ServeEvent>(received));
  EXPECT_EQ(std::get<ServeEvent>(received).kind, EventKind::status);
}

TEST(ServeClientSocket, KeepalivesDoNotExtendTheTimeout) {
  FakeServer server;
  ServeClient client = connected(server.endpoint());
  ASSERT_TRUE(client.send_status());
  auto from = server.receive(std::chrono::seconds(5));
  ASSERT_TRUE(from);
  server.send(from->routing_id, {""});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(std::holds_alternative<NoEvent>(client.receive(std::chrono::milliseconds(200))));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(195));
  EXPECT_LT(waited, std::chrono::seconds(2));
}

TEST(ServeClientSocket, AMultiFrameMessageIsABadEventAndTheNextEventStillComes) {
  FakeServer server;
  ServeClient client = connected(server.endpoint());
  ASSERT_TRUE(client.send_status());
  auto from = server.receive(std::chrono::seconds(5));
  ASSERT_TRUE(from);
  server.send(from->routing_id, {kStatusEvent, kStatusEvent});
  server.send(from->routing_id, {"\xc1"});
  server.send(from->routing_id, {kStatusEvent});
  EXPECT_TRUE(std::holds_alternative<BadEvent>(client.receive(std::chrono::seconds(5))));
  EXPECT_TRUE(std::holds_alternative<BadEvent>(client.receive(std::chrono::seconds(5))));
  Received received = client.receive(std::chrono::seconds(5));
  ASSERT_TRUE(std::holds_alternative<ServeEvent>(received));
  EXPECT_EQ(std::get<ServeEvent>(received).kind, EventKind::status);
}

}  // namespace
}  // namespace mqlm::tools
