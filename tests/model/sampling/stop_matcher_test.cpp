#include "model/sampling/stop_matcher.hpp"

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace mqlm::model {
namespace {

constexpr std::int32_t kText = 100;  // any token that is not a stop token
constexpr std::int32_t kEos = 2;

struct Outcome {
  std::vector<std::string> emitted;  // per step
  std::string text;                  // all of it
  StopStep last;
};

Outcome run(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  Outcome outcome;
  for (const auto& piece : pieces) {
    outcome.last = matcher.push(kText, piece);
    outcome.emitted.push_back(outcome.last.text);
    outcome.text += outcome.last.text;
    if (outcome.last.finish) break;
  }
  return outcome;
}

TEST(StopMatcher, StopStringInsideOneToken) {
  StopMatcher matcher({"END"}, {}, 100);
  auto outcome = run(matcher, {"Hello", " END here"});
  EXPECT_EQ(outcome.emitted, (std::vector<std::string>{"Hello", " "}));
  EXPECT_EQ(outcome.last.finish, FinishReason::stop);
  EXPECT_EQ(outcome.last.stop_string, "END");
  EXPECT_TRUE(matcher.finished());
}

TEST(StopMatcher, StopStringSpanningTwoTokens) {
  StopMatcher matcher({"world"}, {}, 100);
  auto outcome = run(matcher, {"Hello wor", "ld!"});
  EXPECT_EQ(outcome.emitted, (std::vector<std::string>{"Hello ", ""}));
  EXPECT_EQ(outcome.last.finish, FinishReason::stop);
}

TEST(StopMatcher, StopStringSpanningFiveTokens) {
  StopMatcher matcher({"<|stop|>"}, {}, 100);
  std::vector<std::size_t> held;
  std::vector<std::string> pieces = {"ok <", "|", "st", "op", "|> trailing"};
  Outcome outcome;
  for (const auto& piece : pieces) {
    outcome.last = matcher.push(kText, piece);
    outcome.emitted.push_back(outcome.last.text);
    held.push_back(matcher.held_bytes());
  }
  EXPECT_EQ(outcome.emitted, (std::vector<std::string>{"ok ", "", "", "", ""}));
  EXPECT_EQ(held, (std::vector<std::size_t>{1, 2, 4, 6, 0}));
  EXPECT_EQ(outcome.last.finish, FinishReason::stop);
  EXPECT_EQ(outcome.last.stop_string, "<|stop|>");
}

TEST(StopMatcher, OverlappingPrefixesStopAtTheFirstToComplete) {
  for (const auto& pieces : std::vector<std::vector<std::string>>{{"xa", "bc"}, {"xabc"}, {"x", "a", "b", "c"}}) {
    StopMatcher matcher({"abc", "ab"}, {}, 100);
    auto outcome = run(matcher, pieces);
    EXPECT_EQ(outcome.text, "x");
    EXPECT_EQ(outcome.last.stop_string, "ab");
  }
  // "abd" holds "ab" back; "bc" then completes inside it, so only "a" is released.
  StopMatcher matcher({"abd", "bc"}, {}, 100);
  auto outcome = run(matcher, {"ab", "c"});
  EXPECT_EQ(outcome.emitted, (std::vector<std::string>{"", "a"}));
  EXPECT_EQ(outcome.last.stop_string, "bc");
}

TEST(StopMatcher, StopStringAtTheVeryStart) {
  StopMatcher matcher({"STOP"}, {}, 100);
  auto outcome = run(matcher, {"STOP here"});
  EXPECT_EQ(outcome.text, "");
  EXPECT_EQ(outcome.last.finish, FinishReason::stop);
}

TEST(StopMatcher, HeldTextIsReleasedWhenItTurnsOutNotToBeAStop) {
  StopMatcher matcher({"world"}, {}, 100);
  auto outcome = run(matcher, {"a wor", "k", " and w", "o", "nder"});
  EXPECT_EQ(outcome.emitted, (std::vector<std::string>{"a ", "work", " and ", "", "wonder"}));
  EXPECT_FALSE(outcome.last.finish.has_value());
}

TEST(StopMatcher, LengthReleasesHeldText) {
  StopMatcher matcher({"world"}, {}, 2);
  auto outcome = run(matcher, {"a", "wor"});
  EXPECT_EQ(outcome.emitted, (std::vector<std::string>{"a", "wor"}));
  EXPECT_EQ(outcome.last.finish, FinishReason::length);
}

TEST(StopMatcher, StopStringCompletedByTheLastTokenIsAStop) {
  StopMatcher matcher({"world"}, {}, 2);
  auto outcome = run(matcher, {"wor", "ld"});
  EXPECT_EQ(outcome.text, "");
  EXPECT_EQ(outcome.last.finish, FinishReason::stop);
}

TEST(StopMatcher, StopTokenEndsWithoutItsTextAndReleasesHeldText) {
  SamplingParams params;
  params.stop = {"world"};
  params.stop_token_ids = {7};
  auto matcher = StopMatcher::for_request(params, std::vector<std::int32_t>{kEos});
  EXPECT_EQ(matcher.push(kText, "hello wor").text, "hello ");
  auto step = matcher.push(kEos, "</s>");
  EXPECT_EQ(step.text, "wor");
  EXPECT_EQ(step.finish, FinishReason::stop);
  EXPECT_EQ(step.stop_token, kEos);
  EXPECT_TRUE(step.stop_string.empty());

  auto other = StopMatcher::for_request(params, std::vector<std::int32_t>{kEos});
  EXPECT_EQ(other.push(7, "x").stop_token, 7);
}

// ignore_eos (llama-server's and vLLM's): the model's end tokens are text like any other, the
// request's own stop tokens still stop it.
TEST(StopMatcher, IgnoreEosLeavesOutOnlyTheModelsEndTokens) {
  SamplingParams params;
  params.max_tokens = 3;
  params.stop_token_ids = {7};
  params.ignore_eos = true;
  auto matcher = StopMatcher::for_request(params, std::vector<std::int32_t>{kEos});
  EXPECT_FALSE(matcher.push(kEos, "").finish.has_value());
  EXPECT_EQ(matcher.push(7, "x").stop_token, 7);
  auto until_length = StopMatcher::for_request(params, std::vector<std::int32_t>{kEos});
  until_length.push(kEos, "");
  until_length.push(kEos, "");
  EXPECT_EQ(until_length.push(kEos, "").finish, FinishReason::length);
}

TEST(StopMatcher, PushingAfterTheEndIsABug) {
  StopMatcher matcher({}, {kEos}, 1);
  EXPECT_EQ(matcher.push(kText, "a").finish, FinishReason::length);
  EXPECT_THROW(matcher.push(kText, "b"), std::logic_error);
  StopMatcher aborted({"xyz"}, {}, 10);
  aborted.push(kText, "ax");
  EXPECT_EQ(aborted.release(), "x");
  EXPECT_THROW(aborted.push(kText, "b"), std::logic_error);
}

// What is emitted must not depend on how the text was split into tokens.
TEST(StopMatcher, OutputDoesNotDependOnTokenBoundaries) {
  const std::string text = "the quick <|im_e brown <|im_end fox\n\nUser: jumps <|im_end|> over";
  const std::vector<std::string> stops = {"<|im_end|>", "\n\nUser:", "fox!"};
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> pieces;
    for (std::size_t at = 0; at < text.size();) {
      std::size_t length = 1 + rng() % 6;
      pieces.push_back(text.substr(at, length));
      at += length;
    }
    StopMatcher matcher(stops, {}, 1000);
    auto outcome = run(matcher, pieces);
    ASSERT_EQ(outcome.text, "the quick <|im_e brown <|im_end fox") << "trial " << trial;
    ASSERT_EQ(outcome.last.stop_string, "\n\nUser:");
  }
}

}  // namespace
}  // namespace mqlm::model
