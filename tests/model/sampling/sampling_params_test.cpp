#include "model/sampling/sampling_params.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace mqlm::model {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  const char* what;
  std::function<void(SamplingParams&)> change;
  const char* field;  // nullptr: accepted
};

const SamplingLimits kLimits{.vocab_size = 1000, .max_tokens = 4096};

void expect_case(const Case& c) {
  SamplingParams params;
  c.change(params);
  auto problem = validate(params, kLimits);
  if (c.field == nullptr) {
    EXPECT_FALSE(problem.has_value()) << c.what << ": " << (problem ? problem->message : "");
  } else {
    ASSERT_TRUE(problem.has_value()) << c.what << " was accepted";
    EXPECT_EQ(problem->field, c.field) << c.what;
    EXPECT_NE(problem->message.find(c.field), std::string::npos) << problem->message;
  }
}

TEST(SamplingParams, DefaultsAreValid) { EXPECT_FALSE(validate(SamplingParams{}).has_value()); }

TEST(SamplingParams, BoundaryValuesAreAccepted) {
  const Case cases[] = {
      {"greedy", [](auto& p) { p.temperature = 0.0f; }, nullptr},
      {"hottest", [](auto& p) { p.temperature = kMaxTemperature; }, nullptr},
      {"top_p 1", [](auto& p) { p.top_p = 1.0f; }, nullptr},
      {"tiny top_p", [](auto& p) { p.top_p = 1e-6f; }, nullptr},
      {"min_p 0", [](auto& p) { p.min_p = 0.0f; }, nullptr},
      {"min_p 1", [](auto& p) { p.min_p = 1.0f; }, nullptr},
      {"top_k huge", [](auto& p) { p.top_k = 1 << 30; }, nullptr},
      {"presence -2", [](auto& p) { p.presence_penalty = -2.0f; }, nullptr},
      {"frequency 2", [](auto& p) { p.frequency_penalty = 2.0f; }, nullptr},
      {"repetition 100", [](auto& p) { p.repetition_penalty = 100.0f; }, nullptr},
      {"max_tokens 1", [](auto& p) { p.max_tokens = 1; }, nullptr},
      {"max_tokens at the limit", [](auto& p) { p.max_tokens = 4096; }, nullptr},
      {"top_logprobs 20", [](auto& p) { p.logprobs = true; p.top_logprobs = 20; }, nullptr},
      {"16 stops of 256 bytes", [](auto& p) { p.stop.assign(16, std::string(256, 'x')); }, nullptr},
      {"UTF-8 stop", [](auto& p) { p.stop = {"\xe2\x96\x81\xf0\x9f\x98\x80"}; }, nullptr},
      {"last token id", [](auto& p) { p.stop_token_ids = {0, 999}; }, nullptr},
      {"logit_bias at both ends", [](auto& p) { p.logit_bias = {{0, -100.0f}, {999, 100.0f}}; }, nullptr},
      {"1000 biases", [](auto& p) { for (int i = 0; i < 1000; ++i) p.logit_bias.push_back({i, 1.0f}); }, nullptr},
  };
  for (const Case& c : cases) expect_case(c);
}

TEST(SamplingParams, AbsurdValuesAreRejectedByName) {
  const Case cases[] = {
      {"negative temperature", [](auto& p) { p.temperature = -0.5f; }, "temperature"},
      {"NaN temperature", [](auto& p) { p.temperature = kNaN; }, "temperature"},
      {"infinite temperature", [](auto& p) { p.temperature = kInf; }, "temperature"},
      {"temperature over 100", [](auto& p) { p.temperature = 100.5f; }, "temperature"},
      {"negative top_k", [](auto& p) { p.top_k = -1; }, "top_k"},
      {"top_p 0", [](auto& p) { p.top_p = 0.0f; }, "top_p"},
      {"top_p over 1", [](auto& p) { p.top_p = 1.01f; }, "top_p"},
      {"NaN top_p", [](auto& p) { p.top_p = kNaN; }, "top_p"},
      {"negative min_p", [](auto& p) { p.min_p = -0.1f; }, "min_p"},
      {"min_p over 1", [](auto& p) { p.min_p = 1.5f; }, "min_p"},
      {"repetition 0", [](auto& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
      {"NaN repetition", [](auto& p) { p.repetition_penalty = kNaN; }, "repetition_penalty"},
      {"negative window", [](auto& p) { p.repetition_last_n = -1; }, "repetition_last_n"},
      {"presence 2.5", [](auto& p) { p.presence_penalty = 2.5f; }, "presence_penalty"},
      {"frequency -inf", [](auto& p) { p.frequency_penalty = -kInf; }, "frequency_penalty"},
      {"max_tokens 0", [](auto& p) { p.max_tokens = 0; }, "max_tokens"},
      {"max_tokens past the limit", [](auto& p) { p.max_tokens = 4097; }, "max_tokens"},
      {"huge max_tokens", [](auto& p) { p.max_tokens = 2'000'000'000; }, "max_tokens"},
      {"top_logprobs 21", [](auto& p) { p.logprobs = true; p.top_logprobs = 21; }, "top_logprobs"},
      {"negative top_logprobs", [](auto& p) { p.logprobs = true; p.top_logprobs = -1; }, "top_logprobs"},
      {"top_logprobs without logprobs", [](auto& p) { p.top_logprobs = 3; }, "top_logprobs"},
      {"17 stops", [](auto& p) { p.stop.assign(17, "x"); }, "stop"},
      {"empty stop", [](auto& p) { p.stop = {"a", ""}; }, "stop[1]"},
      {"257-byte stop", [](auto& p) { p.stop = {std::string(257, 'x')}; }, "stop[0]"},
      {"invalid UTF-8 stop", [](auto& p) { p.stop = {"ok", "\xc3("}; }, "stop[1]"},
      {"surrogate in stop", [](auto& p) { p.stop = {"\xed\xa0\x80"}; }, "stop[0]"},
      {"token id past the vocabulary", [](auto& p) { p.stop_token_ids = {5, 1000}; }, "stop_token_ids[1]"},
      {"negative token id", [](auto& p) { p.stop_token_ids = {-3}; }, "stop_token_ids[0]"},
      {"65 stop tokens", [](auto& p) { p.stop_token_ids.assign(65, 1); }, "stop_token_ids"},
      {"bias past the vocabulary", [](auto& p) { p.logit_bias = {{5, 1.0f}, {1000, 1.0f}}; }, "logit_bias[\"1000\"]"},
      {"bias of a negative id", [](auto& p) { p.logit_bias = {{-1, 1.0f}}; }, "logit_bias[\"-1\"]"},
      {"bias over 100", [](auto& p) { p.logit_bias = {{123, 100.5f}}; }, "logit_bias[\"123\"]"},
      {"NaN bias", [](auto& p) { p.logit_bias = {{7, kNaN}}; }, "logit_bias[\"7\"]"},
      {"infinite bias", [](auto& p) { p.logit_bias = {{7, -kInf}}; }, "logit_bias[\"7\"]"},
      {"a token biased twice", [](auto& p) { p.logit_bias = {{7, 1.0f}, {8, 1.0f}, {7, 2.0f}}; }, "logit_bias[\"7\"]"},
      {"1025 biases", [](auto& p) { for (int i = 0; i < 1025; ++i) p.logit_bias.push_back({i, 1.0f}); }, "logit_bias"},
  };
  for (const Case& c : cases) expect_case(c);
}

TEST(SamplingParams, LogitBiasIdsAreOnlyCheckedNonNegativeWithoutAVocabulary) {
  SamplingParams params;
  params.logit_bias = {{5'000'000, -100.0f}};
  EXPECT_FALSE(validate(params).has_value());
  params.logit_bias = {{-2, -100.0f}};
  EXPECT_TRUE(validate(params).has_value());
}

// logit_bias went last in the wire array: a message written before it still reads.
TEST(SamplingParams, WireFormWithoutLogitBiasStillReads) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_array(14);
  packer.pack(0.5f).pack(40).pack(0.9f).pack(0.0f).pack(1.0f).pack(64).pack(0.0f).pack(0.0f);
  packer.pack(std::uint64_t{9}).pack(100).pack(std::vector<std::string>{"x"}).pack(std::vector<std::int32_t>{});
  packer.pack(false).pack(0);
  auto handle = msgpack::unpack(buffer.data(), buffer.size());
  auto params = handle.get().as<SamplingParams>();
  EXPECT_EQ(params.top_k, 40);
  EXPECT_EQ(params.seed, 9u);
  EXPECT_TRUE(params.logit_bias.empty());

  params.logit_bias = {{3, -1.5f}};
  msgpack::sbuffer again;
  msgpack::pack(again, params);
  auto round_trip = msgpack::unpack(again.data(), again.size()).get().as<SamplingParams>();
  EXPECT_EQ(round_trip.logit_bias, params.logit_bias);
}

TEST(SamplingParams, MessageSaysValueAndRange) {
  SamplingParams params;
  params.temperature = -0.5f;
  auto problem = validate(params);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->message, "temperature is -0.5: it must be in [0, 100]; 0 means greedy");
}

}  // namespace
}  // namespace mqlm::model
