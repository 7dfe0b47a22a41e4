#include "model/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <span>
#include <tuple>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "model/sampling/philox.hpp"
#include "tests/model/sampling/kept_distribution.hpp"

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

// Pins Philox, the uniform draw and the id-order walk: a change to any of them changes this
// sequence (and the GPU sampler's table tests compare against this sampler).
TEST(Sampler, GoldenSequenceForSeed42) {
  auto logits = irregular_logits(50);
  Sampler sampler(with_temperature(1.0f, 42));
  const std::vector<std::int32_t> golden = {31, 49, 42, 38, 16, 16, 12, 19, 27, 12, 27, 16, 19, 12, 12, 38};
  EXPECT_EQ(draws(sampler, logits, static_cast<int>(golden.size())), golden);
}

// The spec's draw, step by step: u from Philox (seed, token index), float weights relative to the
// max, a double running sum over the kept tokens in id order, the first past u * Z.
TEST(Sampler, DrawWalksTheKeptTokensInIdOrder) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, 0.0f};  // ids not in likelihood order
  const float inverse_temperature = 1.0f / 0.8f;
  std::vector<float> weights;
  double total = 0.0;
  for (float l : logits) total += weights.emplace_back(std::exp((l - 2.0f) * inverse_temperature));
  for (std::uint64_t seed = 0; seed < 500; ++seed) {
    Sampler sampler(with_temperature(0.8f, seed));
    sampler.accept(0);  // the draw below is the second token: Philox counter 1
    double target = double{uniform_for(seed, 1)} * total, mass = 0.0;
    std::int32_t expected = 0;
    while ((mass += weights[expected]) <= target) ++expected;
    ASSERT_EQ(sampler.sample(logits).token, expected) << "seed " << seed;
  }
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

TEST(Sampler, TopKKeepsTiesAtTheThreshold) {
  // By likelihood: 5, 2, 1, then 0 and 7 tie: both are kept at k = 4 (as Hugging Face keeps them).
  std::vector<float> logits = {1.5f, 2.5f, 2.7f, -1.0f, 0.0f, 3.0f, -2.0f, 1.5f, 0.5f, -0.5f};
  auto params = with_temperature(1.0f);
  params.top_k = 3;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{1, 2, 5}));
  params.top_k = 4;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 1, 2, 5, 7}));
  params.top_k = 5;
  EXPECT_EQ(support(params, logits), (std::set<std::int32_t>{0, 1, 2, 5, 7}));
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
  // Descending by id in steps small enough that p = 0.25 needs several hundred tokens.
  std::vector<float> logits(2000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = -0.0005f * static_cast<float>(i);
  auto params = with_temperature(1.0f);
  params.top_p = 0.25f;
  auto kept = support(params, logits, 20000);
  double total = 0.0, mass = 0.0;
  for (float l : logits) total += std::exp(double{l});
  std::int32_t last = 0;
  while ((mass += std::exp(double{logits[last]})) < 0.25 * total) ++last;
  EXPECT_GT(last, 256);  // past the first two chunks of the partial sort
  EXPECT_EQ(*kept.rbegin(), last);
  EXPECT_EQ(kept.size(), static_cast<std::size_t>(last) + 1);
}

TEST(Sampler, TopPKeepsTiesAtItsThreshold) {
  std::vector<float> logits(2000, 0.0f);  // uniform: the value where p = 0.25 is reached is everyone's
  auto params = with_temperature(1.0f);
  params.top_p = 0.25f;
  EXPECT_EQ(support(params, logits, 40000).size(), logits.size());
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

// ---- logit_bias, the allowed-token mask, and the order of the adjustments ------------------

// The adjusted logits minus those of token `reference`, read from the logprobs (vocabulary <= 20).
std::vector<double> adjusted_minus(Sampler& sampler, const std::vector<float>& logits, std::int32_t reference,
                                   std::span<const std::uint32_t> allowed_bits = {}) {
  auto result = sampler.sample(logits, allowed_bits);
  std::vector<double> lp(logits.size(), -std::numeric_limits<double>::infinity());
  for (const auto& t : result.top_logprobs) lp[t.token] = t.logprob;
  double base = lp[reference];
  for (auto& v : lp) v -= base;
  return lp;
}

TEST(Sampler, BiasAndPenaltiesChangeExactlyTheLogitsTheyName) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
  Sampler plain(observing());
  auto before = adjusted_minus(plain, logits, 4);
  auto params = observing();
  params.logit_bias = {{0, 1.0f}, {3, -0.5f}, {5, 3.0f}};
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 1.0f;
  params.frequency_penalty = 0.5f;
  std::vector<std::int32_t> prompt = {0, 1};
  Sampler sampler(params, prompt);
  sampler.accept(2);
  sampler.accept(2);  // token 2 enters the window and was generated twice
  auto after = adjusted_minus(sampler, logits, 4);
  // Bias first, then the penalties: (2 + 1) / 2, -2 * 2, 1 / 2 - (2 * 0.5 + 1), 0.5 - 0.5, -1 + 3.
  const std::vector<double> expected = {1.5, -4.0, -1.5, 0.0, 0.0, 2.0};
  for (std::size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(before[i], logits[i], 1e-5) << "token " << i;
    EXPECT_NEAR(after[i], expected[i], 1e-5) << "token " << i;
  }
}

TEST(Sampler, BiasOfMinus100BansAndOutOfRangeIdsAreIgnored) {
  auto params = with_temperature(1.0f);
  params.logit_bias = {{1, -100.0f}, {50, 100.0f}};  // 50 lies beyond this row's 3 tokens
  EXPECT_EQ(support(params, {0.0f, 5.0f, 0.0f}), (std::set<std::int32_t>{0, 2}));
}

TEST(Sampler, MaskedTokensAreNeverChosen) {
  std::vector<float> logits = {1.0f, 9.0f, 0.5f, 8.0f, 0.0f};
  std::vector<std::uint32_t> allowed = {0b10101};  // tokens 0, 2 and 4
  Sampler sampler(with_temperature(1.0f, 3));
  std::set<std::int32_t> chosen;
  for (int i = 0; i < 2000; ++i) chosen.insert(sampler.sample(logits, allowed).token);
  EXPECT_EQ(chosen, (std::set<std::int32_t>{0, 2, 4}));
  Sampler greedy(observing());
  auto diff = adjusted_minus(greedy, logits, 4, allowed);
  EXPECT_EQ(diff[1], -std::numeric_limits<double>::infinity());
  EXPECT_NEAR(diff[0], 1.0, 1e-5);
  std::vector<std::uint32_t> none = {0};
  EXPECT_THROW(sampler.sample(logits, none), std::invalid_argument);
  std::vector<float> wide(40, 0.0f);
  EXPECT_THROW(sampler.sample(wide, allowed), std::invalid_argument);  // 40 tokens need 2 words
}

// ---- the GPU's row and the host's history ------------------------------------------------

TEST(Sampler, GpuRowDescribesBiasWindowAndCounts) {
  auto params = with_temperature(0.8f, 77);
  params.repetition_penalty = 1.5f;
  params.repetition_last_n = 3;
  params.min_p = 0.1f;
  params.presence_penalty = 0.3f;  // counts are listed only where a penalty reads them
  params.logit_bias = {{7, 2.0f}};
  std::vector<std::int32_t> prompt = {1, 2, 3};
  Sampler sampler(params, prompt);
  sampler.accept(4);
  sampler.accept(2);  // the window is now {3, 4, 2}
  auto row = sampler.gpu_row(false);
  EXPECT_EQ(row.counter, 2u);
  EXPECT_EQ(row.seed, 77u);
  EXPECT_EQ(row.min_p_offset, 0.8f * std::log(0.1f));
  auto entry = [](std::int32_t token, float bias, std::uint32_t in_window, std::uint32_t count) {
    return std::tuple{token, bias, in_window, count};
  };
  auto as_tuples = [](const SamplingRow& r) {
    std::vector<std::tuple<std::int32_t, float, std::uint32_t, std::uint32_t>> out;
    for (const auto& e : r.entries) out.emplace_back(e.token, e.bias, e.in_window, e.count);
    return out;
  };
  EXPECT_EQ(as_tuples(row), (std::vector{entry(2, 0, 1, 1), entry(3, 0, 1, 0), entry(4, 0, 1, 1), entry(7, 2, 0, 0)}));
  // A token pending on the GPU: the host's window shrinks to the last 2 known tokens ({4, 2}),
  // and the draw is the next one.
  auto pending = sampler.gpu_row(true);
  EXPECT_EQ(pending.counter, 3u);
  EXPECT_EQ(as_tuples(pending), (std::vector{entry(2, 0, 1, 1), entry(4, 0, 1, 1), entry(7, 2, 0, 0)}));
}

// A row verifying drafts is the row the sampler would send once it had accepted them: its
// counter, window and counts move on by the drafts.
TEST(Sampler, GpuRowAfterDraftsIsTheRowOnceTheyAreAccepted) {
  auto params = with_temperature(0.9f, 5);
  params.repetition_penalty = 1.3f;
  params.repetition_last_n = 4;
  params.frequency_penalty = 0.2f;
  params.logit_bias = {{11, 1.0f}};
  Sampler sampler(params, std::vector<std::int32_t>{1, 2, 3});
  sampler.accept(4);
  const std::vector<std::int32_t> drafts = {5, 4, 6};
  Sampler accepted = sampler;
  for (std::int32_t token : drafts) accepted.accept(token);
  auto same = [](const SamplingRow& a, const SamplingRow& b) {
    if (a.counter != b.counter || a.entries.size() != b.entries.size()) return false;
    for (std::size_t i = 0; i < a.entries.size(); ++i) {
      const SamplingEntry &x = a.entries[i], &y = b.entries[i];
      if (x.token != y.token || x.bias != y.bias || x.in_window != y.in_window || x.count != y.count) return false;
    }
    return true;
  };
  EXPECT_TRUE(same(sampler.gpu_row_after(drafts), accepted.gpu_row(false)));
  EXPECT_EQ(sampler.gpu_row_after(drafts).counter, 4u);
  EXPECT_FALSE(same(sampler.gpu_row_after(drafts), sampler.gpu_row(false)));
  EXPECT_TRUE(same(sampler.gpu_row_after({}), sampler.gpu_row(false)));
}

TEST(Sampler, GpuRowWithoutPenaltiesListsOnlyTheBias) {
  auto params = with_temperature(0.7f);
  params.logit_bias = {{9, -3.0f}};
  Sampler sampler(params, std::vector<std::int32_t>{1, 2});
  sampler.accept(5);
  sampler.accept(5);
  const auto row = sampler.gpu_row(true);
  ASSERT_EQ(row.entries.size(), 1u);
  EXPECT_EQ(row.entries[0].token, 9);
  EXPECT_EQ(row.entries[0].count, 0u);
  EXPECT_EQ(row.counter, 3u);
}

TEST(Sampler, GpuRowWithoutRepetitionPenaltyHasNoWindow) {
  auto params = with_temperature(1.0f);
  params.frequency_penalty = 0.5f;
  std::vector<std::int32_t> prompt = {1, 2};
  Sampler sampler(params, prompt);
  sampler.accept(5);
  auto row = sampler.gpu_row(true);
  EXPECT_EQ(row.min_p_offset, -std::numeric_limits<float>::infinity());
  ASSERT_EQ(row.entries.size(), 1u);
  EXPECT_EQ(row.entries[0].token, 5);
  EXPECT_EQ(row.entries[0].in_window, 0u);
  EXPECT_EQ(row.entries[0].count, 1u);
}

// The draw depends on the seed and the token's index only: tokens the GPU chose and the host
// accepted leave the next CPU draw where it would have been.
TEST(Sampler, AcceptedTokensAdvanceTheDrawLikeSampledOnes) {
  auto logits = irregular_logits(50);
  auto params = with_temperature(1.0f, 1234);
  params.frequency_penalty = 0.3f;
  Sampler sampling(params), accepting(params);
  for (int i = 0; i < 20; ++i) accepting.accept(sampling.sample(logits).token);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(sampling.sample(logits).token, accepting.sample(logits).token);
}

// ---- the draws follow the kept set's distribution: chi-square goodness of fit ---------------

struct FilterCase {
  const char* name;
  float temperature;
  std::int32_t top_k;
  float top_p;
  float min_p;
};

TEST(Sampler, DrawsFollowTheKeptDistribution) {
  // The 11th most likely token is raised to tie the 10th: top-k 10 keeps both, so ties are part
  // of what is fitted.
  auto logits = irregular_logits(40);
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
  logits[order[10]] = logits[order[9]];
  const FilterCase cases[] = {
      {"top-k", 0.7f, 10, 1.0f, 0.0f},
      {"top-p", 1.0f, 0, 0.8f, 0.0f},
      {"min-p", 1.3f, 0, 1.0f, 0.2f},
      {"all", 0.7f, 20, 0.95f, 0.05f},
      {"hot", 2.0f, 0, 1.0f, 0.0f},
  };
  const int n = 20000;
  for (const FilterCase& c : cases) {
    auto params = with_temperature(c.temperature);
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    std::vector<int> counts(logits.size());
    for (int draw = 0; draw < n; ++draw) {
      params.seed = 1000003ull * static_cast<std::uint64_t>(draw);  // a request each
      ++counts[Sampler(params).sample(logits).token];
    }
    auto expected = testing::kept_distribution(logits, params);
    if (c.top_k == 10) {
      EXPECT_EQ(std::count_if(expected.begin(), expected.end(), [](double p) { return p > 0; }), 11);
    }
    auto [statistic, df] = testing::chi_square(counts, expected, n);
    EXPECT_LT(statistic, testing::critical_value(df)) << c.name << ": df " << df;
    // The same draws against a wrong expectation (30% hotter) fail: the test can tell.
    SamplingParams wrong = params;
    wrong.temperature *= 1.3f;
    auto [wrong_statistic, wrong_df] = testing::chi_square(counts, testing::kept_distribution(logits, wrong), n);
    EXPECT_GT(wrong_statistic, testing::critical_value(wrong_df)) << c.name << " (wrong expectation)";
  }
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
