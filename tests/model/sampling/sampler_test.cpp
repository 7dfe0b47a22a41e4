#include "model/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace mqlm::model {
namespace {

SamplingParams with_temperature(float temperature, std::uint64_t seed = 7) {
  SamplingParams params;
  params.temperature = temperature;
  params.seed = seed;
  return params;
}

// A fixed, irregular distribution over `n` tokens.
std::vector<float> irregular_logits(std::size_t n) {
  std::vector<float> logits(n);
  for (std::size_t i = 0; i < n; ++i) logits[i] = 2.0f * std::sin(static_cast<float>(i) * 1.7f) + 0.1f * static_cast<float>(i % 5);
  return logits;
}

std::vector<float> logits_of(std::vector<double> probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(l - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - max - std::log(sum));
  return out;
}

std::vector<std::int32_t> draws(Sampler& sampler, const std::vector<float>& logits, int count) {
  std::vector<std::int32_t> tokens;
  for (int i = 0; i < count; ++i) tokens.push_back(sampler.sample(logits).token);
  return tokens;
}

std::map<std::int32_t, int> histogram(const std::vector<std::int32_t>& tokens) {
  std::map<std::int32_t, int> counts;
  for (auto t : tokens) ++counts[t];
  return counts;
}

std::set<std::int32_t> support(const SamplingParams& params, const std::vector<float>& logits, int count = 2000) {
  Sampler sampler(params);
  auto tokens = draws(sampler, logits, count);
  return {tokens.begin(), tokens.end()};
}

// ---- determinism -----------------------------------------------------------------------

TEST(Sampler, SameSeedSameThousandTokens) {
  auto logits = irregular_logits(50);
  Sampler a(with_temperature(1.0f, 42)), b(with_temperature(1.0f, 42));
  EXPECT_EQ(draws(a, logits, 1000), draws(b, logits, 1000));
}

TEST(Sampler, DifferentSeedsDiffer) {
  auto logits = irregular_logits(50);
  Sampler a(with_temperature(1.0f, 42)), b(with_temperature(1.0f, 43));
  auto first = draws(a, logits, 1000), second = draws(b, logits, 1000);
  int differing = 0;
  for (std::size_t i = 0; i < first.size(); ++i) differing += first[i] != second[i];
  EXPECT_GT(differing, 500);  // independent draws from this distribution agree ~10% of the time
}

// Pins the generator, the uniform draw and the order candidates are drawn in: a change to any of
// them (or a standard library that differs) changes this sequence.
TEST(Sampler, GoldenSequenceForSeed42) {
  auto logits = irregular_logits(50);
  Sampler sampler(with_temperature(1.0f, 42));
  const std::vector<std::int32_t> golden = {38, 34, 38, 8, 46, 4, 30, 19, 12, 19, 1, 27, 34, 34, 42, 49};
  EXPECT_EQ(draws(sampler, logits, static_cast<int>(golden.size())), golden);
}

// ---- greedy and the filters -------------------------------------------------------------

TEST(Sampler, GreedyIsArgmaxWithTiesToLowestId) {
  Sampler sampler(with_temperature(0.0f));
  EXPECT_EQ(sampler.sample(std::vector<float>{1.0f, 3.0f, 0.0f, 3.0f}).token, 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-5.0f, -2.0f, -2.0f}).token, 1);
  auto logits = irregular_logits(1000);
  auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(sampler.sample(logits).token, argmax);
}

TEST(Sampler, TopKKeepsExactlyK) {
  // By likelihood: 5, 2, 1, then 0 and 7 tie (the tie goes to the lower id).
  std::vector<float> logits = {1.5f, 2.5f, 2.7f, -1.0f, 0.0f, 3.0f, -2.0f, 1.5f, 0.5f, -0.5f};
  auto params = with_temperature(1.0f);
  params.top_k = 3;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{1, 2, 5}));
  params.top_k = 4;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 1, 2, 5}));
  params.top_k = 1;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{5}));
  params.top_k = 100;
  EXPECT_EQ(support(params, logits, 20000).size(), logits.size());
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // Token ids deliberately out of likelihood order.
  auto logits = logits_of({0.15, 0.5, 0.05, 0.3});
  auto params = with_temperature(1.0f);
  params.top_p = 0.5f;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{1}));
  params.top_p = 0.8f;  // 0.5 + 0.3 reaches it exactly
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{1, 3}));
  params.top_p = 0.81f;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 1, 3}));
  params.top_p = 0.96f;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, TopPOverALargeVocabularyReachesPastTheFirstChunk) {
  std::vector<float> logits(2000, 0.0f);  // uniform: p = 0.25 needs 500 tokens
  auto params = with_temperature(1.0f);
  params.top_p = 0.25f;
  auto kept = support(params, logits, 10000);
  EXPECT_EQ(kept.size(), 500u);
  EXPECT_EQ(*kept.rbegin(), 499);  // ties go to the lowest ids
}

TEST(Sampler, MinPIsRelativeToTheMostLikelyAfterTemperature) {
  auto logits = logits_of({0.3, 0.1, 0.4, 0.2});
  auto params = with_temperature(1.0f);
  params.min_p = 0.6f;  // keeps p >= 0.24
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 2}));
  params.min_p = 0.45f;  // keeps p >= 0.18
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 2, 3}));
  params.min_p = 1.0f;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{2}));
  // At temperature 2 the ratios to the max are sqrt(p / 0.4): 0.87, 0.5, 1, 0.71.
  params.temperature = 2.0f;
  params.min_p = 0.6f;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 2, 3}));
}

TEST(Sampler, FiltersCompose) {
  auto logits = logits_of({0.05, 0.4, 0.25, 0.2, 0.1});
  auto params = with_temperature(1.0f);
  params.top_k = 4;     // drops token 0
  params.top_p = 0.7f;  // of 0.95 renormalised: 0.42, 0.26, 0.21, 0.105 -> needs 3
  params.min_p = 0.6f;  // of those, p >= 0.6 * 0.4 drops token 3
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{1, 2}));
}

// Frequencies over 10000 draws lie within 0.03 of softmax(logits / T); with a fixed seed this
// cannot flake, and 0.03 is over 6 standard deviations, so any correct generator passes too.
TEST(Sampler, TemperatureSharpensAndFlattens) {
  std::vector<float> logits = {1.0f, 0.0f};
  const int n = 10000;
  auto frequency_of_first = [&](float temperature) {
    Sampler sampler(with_temperature(temperature, 99));
    return histogram(draws(sampler, logits, n))[0] / double{n};
  };
  auto expected = [](double t) { return 1.0 / (1.0 + std::exp(-1.0 / t)); };  // 0.881, 0.731, 0.622
  double cold = frequency_of_first(0.5f), plain = frequency_of_first(1.0f), hot = frequency_of_first(2.0f);
  EXPECT_NEAR(cold, expected(0.5), 0.03);
  EXPECT_NEAR(plain, expected(1.0), 0.03);
  EXPECT_NEAR(hot, expected(2.0), 0.03);
  EXPECT_GT(cold, plain);
  EXPECT_GT(plain, hot);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  auto logits = irregular_logits(8);
  auto expected = log_softmax(logits);
  const int n = 20000;
  Sampler sampler(with_temperature(1.0f, 5));
  auto counts = histogram(draws(sampler, logits, n));
  for (std::size_t i = 0; i < logits.size(); ++i)
    EXPECT_NEAR(counts[static_cast<std::int32_t>(i)] / double{n}, std::exp(expected[i]), 0.025) << "token " << i;
}

// ---- penalties, seen through the logprobs (which are of the penalised logits) --------------

// The penalised logits up to a constant: logprob differences, over a vocabulary of <= 20.
std::vector<double> penalised_minus(Sampler& sampler, const std::vector<float>& logits, std::int32_t reference) {
  auto result = sampler.sample(logits);
  std::vector<double> lp(logits.size());
  for (const auto& t : result.top_logprobs) lp[t.token] = t.logprob;
  double base = lp[reference];
  for (auto& v : lp) v -= base;
  return lp;
}

SamplingParams observing() {
  SamplingParams params = with_temperature(0.0f);
  params.logprobs = true;
  params.top_logprobs = 20;
  return params;
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  auto params = observing();
  params.repetition_penalty = 2.0f;
  std::vector<std::int32_t> prompt = {0, 1, 1, 0};  // repeated tokens are penalised once
  Sampler sampler(params, prompt);
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f};
  auto diff = penalised_minus(sampler, logits, 2);  // token 2 is untouched
  EXPECT_NEAR(diff[0], 1.0 - 1.0, 1e-5);   // 2 / 2
  EXPECT_NEAR(diff[1], -4.0 - 1.0, 1e-5);  // -2 * 2
  EXPECT_NEAR(diff[3], 0.5 - 1.0, 1e-5);
}

TEST(Sampler, RepetitionPenaltyLooksAtTheLastNTokensOnly) {
  auto params = observing();
  params.repetition_penalty = 2.0f;
  params.repetition_last_n = 2;
  std::vector<std::int32_t> prompt = {0, 1, 3};  // token 0 has left the window
  Sampler sampler(params, prompt);
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 4.0f};
  auto diff = penalised_minus(sampler, logits, 2);
  EXPECT_NEAR(diff[0], 2.0 - 1.0, 1e-5);
  EXPECT_NEAR(diff[1], -4.0 - 1.0, 1e-5);
  EXPECT_NEAR(diff[3], 0.25 - 1.0, 1e-5);
  // The step above generated token 4 (the argmax): now the window is {3, 4}.
  auto after = penalised_minus(sampler, logits, 2);
  EXPECT_NEAR(after[1], -2.0 - 1.0, 1e-5);  // token 1 has left the window
  EXPECT_NEAR(after[3], 0.25 - 1.0, 1e-5);
  EXPECT_NEAR(after[4], 2.0 - 1.0, 1e-5);   // 4 / 2
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  auto params = observing();
  params.presence_penalty = 1.0f;
  params.frequency_penalty = 0.5f;
  std::vector<std::int32_t> prompt = {2, 2, 2};
  Sampler sampler(params, prompt);
  std::vector<float> logits = {20.0f, 0.0f, 1.0f, 3.0f};
  for (int i = 0; i < 3; ++i) ASSERT_EQ(sampler.sample(logits).token, 0);
  auto diff = penalised_minus(sampler, logits, 1);
  EXPECT_NEAR(diff[0], 20.0 - (3 * 0.5 + 1.0), 1e-4);
  EXPECT_NEAR(diff[2], 1.0, 1e-5);  // only in the prompt
  EXPECT_NEAR(diff[3], 3.0, 1e-5);
  EXPECT_EQ(sampler.generated_count(), 4);
}

TEST(Sampler, NegativePresencePenaltyRaisesGeneratedTokens) {
  auto params = observing();
  params.presence_penalty = -2.0f;
  Sampler sampler(params);
  std::vector<float> logits = {1.0f, 0.0f};
  EXPECT_EQ(sampler.sample(logits).token, 0);
  auto diff = penalised_minus(sampler, logits, 1);
  EXPECT_NEAR(diff[0], 3.0, 1e-5);
}

// ---- logprobs -------------------------------------------------------------------------

TEST(Sampler, LogprobsMatchLogSoftmaxBeforeTemperatureAndFilters) {
  auto logits = irregular_logits(32);
  auto expected = log_softmax(logits);
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
  auto params = with_temperature(0.7f, 3);
  params.top_k = 2;
  params.logprobs = true;
  params.top_logprobs = 5;
  Sampler sampler(params);
  for (int step = 0; step < 20; ++step) {
    auto result = sampler.sample(logits);
    ASSERT_TRUE(result.logprob.has_value());
    EXPECT_NEAR(*result.logprob, expected[result.token], 1e-5);
    ASSERT_EQ(result.top_logprobs.size(), 5u);
    for (std::size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(result.top_logprobs[i].token, order[i]);
      EXPECT_NEAR(result.top_logprobs[i].logprob, expected[order[i]], 1e-5);
    }
  }
}

TEST(Sampler, NoLogprobsUnlessAsked) {
  Sampler sampler(with_temperature(1.0f));
  auto result = sampler.sample(irregular_logits(10));
  EXPECT_FALSE(result.logprob.has_value());
  EXPECT_TRUE(result.top_logprobs.empty());
}

// ---- GPU-preselected candidates ----------------------------------------------------------

struct TopK {
  std::vector<std::int32_t> ids;
  std::vector<float> logits;
};

// The k most likely, in a scrambled order (a GPU gives no order).
TopK top_candidates(const std::vector<float>& logits, std::size_t k) {
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
  order.resize(k);
  std::reverse(order.begin(), order.end());
  std::swap(order.front(), order[k / 2]);
  TopK top;
  for (auto id : order) {
    top.ids.push_back(id);
    top.logits.push_back(logits[id]);
  }
  return top;
}

double full_log_sum_exp(const std::vector<float>& logits) {
  return -log_softmax(logits)[0] + logits[0];
}

TEST(Sampler, CandidatesDrawLikeTheFullLogitsWhenTheyCoverTopK) {
  auto logits = irregular_logits(200);
  auto params = with_temperature(0.9f, 11);
  params.top_k = 5;
  params.logprobs = true;
  Sampler full(params), preselected(params);
  auto top = top_candidates(logits, 16);
  CandidateLogits candidates{top.ids, top.logits, static_cast<float>(full_log_sum_exp(logits))};
  for (int i = 0; i < 300; ++i) {
    auto a = full.sample(logits);
    auto b = preselected.sample(candidates);
    ASSERT_EQ(a.token, b.token) << "draw " << i;
    EXPECT_NEAR(*a.logprob, *b.logprob, 1e-4);
  }
}

TEST(Sampler, CandidateLogprobsStayExactUnderPenalties) {
  auto logits = irregular_logits(100);
  auto params = observing();
  params.top_logprobs = 3;
  params.repetition_penalty = 1.5f;
  params.frequency_penalty = 0.7f;
  // Penalties reach candidates only, so the penalised tokens are among them here.
  auto top = top_candidates(logits, 40);
  std::vector<std::int32_t> prompt = {top.ids[0], top.ids[3], top.ids[10], top.ids[39]};
  Sampler full(params, prompt), preselected(params, prompt);
  CandidateLogits candidates{top.ids, top.logits, static_cast<float>(full_log_sum_exp(logits))};
  for (int i = 0; i < 10; ++i) {
    auto a = full.sample(logits);
    auto b = preselected.sample(candidates);
    ASSERT_EQ(a.token, b.token);
    EXPECT_NEAR(*a.logprob, *b.logprob, 1e-4);
    for (std::size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(a.top_logprobs[j].token, b.top_logprobs[j].token);
      EXPECT_NEAR(a.top_logprobs[j].logprob, b.top_logprobs[j].logprob, 1e-4);
    }
  }
}

TEST(Sampler, CandidatesWithoutLogSumExpNormaliseOverThemselves) {
  std::vector<std::int32_t> ids = {9, 4};
  std::vector<float> logits = {0.0f, 0.0f};
  auto params = observing();
  Sampler sampler(params);
  auto result = sampler.sample(CandidateLogits{ids, logits, std::nullopt});
  EXPECT_EQ(result.token, 4);
  EXPECT_NEAR(*result.logprob, std::log(0.5), 1e-6);
}

TEST(Sampler, MalformedCandidatesAreBugs) {
  Sampler sampler(with_temperature(1.0f));
  std::vector<std::int32_t> ids = {3, 3};
  std::vector<float> logits = {1.0f, 2.0f}, one = {1.0f};
  EXPECT_THROW(sampler.sample(CandidateLogits{ids, logits, std::nullopt}), std::invalid_argument);
  EXPECT_THROW(sampler.sample(CandidateLogits{ids, one, std::nullopt}), std::invalid_argument);
}

// ---- degenerate logits -------------------------------------------------------------------

TEST(Sampler, NaNIsNeverChosenAndInfinityAlwaysIs) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Sampler sampler(with_temperature(1.0f));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(sampler.sample(std::vector<float>{nan, 0.0f, nan}).token, 1);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(sampler.sample(std::vector<float>{0.0f, 50.0f, inf}).token, 2);
  EXPECT_THROW(sampler.sample(std::vector<float>{nan, -inf}), std::invalid_argument);
}

TEST(Sampler, InvalidParametersAreABug) {
  auto params = with_temperature(-1.0f);
  EXPECT_THROW(Sampler{params}, std::invalid_argument);
}

}  // namespace
}  // namespace mqlm::model
