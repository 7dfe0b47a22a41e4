// The GPU sampler (gpu::ops::sample, shaders/sample.comp) against the CPU one it must agree with
// (model::Sampler, the reference): the same tokens and logprobs given the same logits, parameters
// and seeds, over a table of parameter combinations and thousands of draws; its draws against the
// exact distribution (chi-square); the token before a draw still on the GPU (a chained step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../../gpu/gpu_fixture.hpp"
#include "gpu/ops.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/sampling/sampler.hpp"
#include "tests/model/sampling/kept_distribution.hpp"

namespace mqlm::model {
namespace {

using gpu::testing::shared_gpu;

// One draw to make: a row of logits, the sampler that draws it on the CPU (its history included),
// and whether the token before it is handed to the GPU as the step before's (pending).
struct Draw {
  std::vector<float> logits;
  Sampler sampler;
  std::int32_t pending = -1;  // the token the GPU adds to the history itself; -1: none
};

// Runs the draws as one step's rows on the GPU.
std::vector<SampledToken> gpu_draws(const std::vector<Draw>& draws) {
  auto& g = shared_gpu();
  const auto rows = static_cast<std::uint32_t>(draws.size());
  std::uint32_t stride = 0;
  for (const Draw& d : draws) stride = std::max<std::uint32_t>(stride, d.logits.size());
  std::vector<float> logits(std::size_t{rows} * stride, -std::numeric_limits<float>::infinity());
  std::vector<std::uint32_t> previous(rows, 0);
  StepSampling sampling;
  for (std::uint32_t r = 0; r < rows; ++r) {
    const Draw& d = draws[r];
    std::copy(d.logits.begin(), d.logits.end(), logits.begin() + std::ptrdiff_t{r} * stride);
    const bool pending = d.pending >= 0;
    if (pending) previous[r] = static_cast<std::uint32_t>(d.pending);
    add_sampling_row(sampling, d.sampler.gpu_row(pending), static_cast<std::uint32_t>(d.logits.size()),
                     pending ? std::optional<std::uint32_t>(r) : std::nullopt);
  }
  const std::vector<std::uint32_t> none(4, 0);
  auto x = g.up(logits);
  auto rows_buffer = g.up(std::vector<gpu::ops::SampleRow>(sampling.rows));
  auto entries = g.up(sampling.entries.empty() ? none : sampling.entries);
  auto mask = g.up(sampling.mask.empty() ? none : sampling.mask);
  auto prev = g.up(previous);
  auto scratch = g.scratch(gpu::ops::sample_scratch_bytes(rows, stride));
  auto out = g.scratch(std::uint64_t{rows} * gpu::ops::sample_out_words * 4);
  auto ids = g.scratch(std::uint64_t{rows} * 4);
  auto arrivals = g.up(std::vector<std::uint32_t>(std::size_t{rows} * gpu::ops::sample_arrival_words, 0));
  gpu::testing::run_step(g, [&](gpu::Recording& rec) {
    gpu::ops::sample(rec, g.kernels,
                     {x.range(), rows_buffer.range(), entries.range(), mask.range(), prev.range(), scratch.range(),
                      out.range(), ids.range(), arrivals.range()},
                     rows, stride, gpu::ops::sample_needs(sampling.rows));
  });
  // The passes leave the counters as they found them, for the next step.
  EXPECT_EQ(g.down<std::uint32_t>(arrivals, std::size_t{rows} * gpu::ops::sample_arrival_words),
            std::vector<std::uint32_t>(std::size_t{rows} * gpu::ops::sample_arrival_words, 0));
  const auto words = g.down<std::uint32_t>(out, std::size_t{rows} * gpu::ops::sample_out_words);
  const auto chosen = sampled_tokens(words, top_logprob_counts(sampling));
  const auto next_ids = g.down<std::uint32_t>(ids, rows);
  for (std::uint32_t r = 0; r < rows; ++r) EXPECT_EQ(next_ids[r], static_cast<std::uint32_t>(chosen[r].token));
  return chosen;
}

// Logits shaped like a model's: a few likely tokens over a long tail, and ties where `ties`.
std::vector<float> model_like(std::size_t n, std::uint64_t seed, float spread = 3.0f, bool ties = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> tail(0.0f, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = tail(rng);
  for (int i = 0; i < 8; ++i) v[rng() % n] += 4.0f * spread;  // a head
  if (ties) {
    for (auto& x : v) x = std::round(x * 2.0f) / 2.0f;
  }
  return v;
}

struct Case {
  std::string name;
  SamplingParams params;
  std::size_t vocab;
  float spread = 3.0f;
  bool ties = false;
};

SamplingParams with(float temperature, std::int32_t top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

std::vector<Case> cases() {
  std::vector<Case> c{
      {"greedy", with(0.0f, 0, 1.0f, 0.0f), 4000},
      {"temperature 1, nothing else", with(1.0f, 0, 1.0f, 0.0f), 32000},
      {"0.7, top_p 0.95", with(0.7f, 0, 0.95f, 0.0f), 32000},
      {"top_k 40", with(0.8f, 40, 1.0f, 0.0f), 6000},
      {"top_k 40, top_p 0.9", with(1.0f, 40, 0.9f, 0.0f), 6000},
      {"min_p 0.05", with(1.0f, 0, 1.0f, 0.05f), 6000},
      {"min_p and top_p", with(1.3f, 0, 0.8f, 0.1f), 6000},
      {"flat: a nucleus past the candidates", with(1.0f, 0, 0.95f, 0.0f), 9000, 0.3f},
      {"top_k past the candidates", with(1.0f, 3000, 1.0f, 0.0f), 9000, 0.3f},
      {"ties at the thresholds", with(0.9f, 10, 0.7f, 0.0f), 3000, 2.0f, true},
      {"greedy over ties", with(0.0f, 0, 1.0f, 0.0f), 3000, 2.0f, true},
  };
  SamplingParams logprobs = with(0.7f, 0, 0.95f, 0.0f);
  logprobs.logprobs = true;
  logprobs.top_logprobs = 5;
  c.push_back({"logprobs, top 5", logprobs, 8000});
  SamplingParams greedy_logprobs = with(0.0f, 0, 1.0f, 0.0f);
  greedy_logprobs.logprobs = true;
  greedy_logprobs.top_logprobs = 20;
  c.push_back({"greedy with 20 top logprobs over ties", greedy_logprobs, 3000, 2.0f, true});
  SamplingParams penalties = with(0.8f, 0, 0.95f, 0.0f);
  penalties.repetition_penalty = 1.3f;
  penalties.repetition_last_n = 16;
  penalties.presence_penalty = 0.5f;
  penalties.frequency_penalty = 0.4f;
  penalties.logprobs = true;
  c.push_back({"penalties", penalties, 5000});
  SamplingParams bias = with(1.0f, 50, 1.0f, 0.0f);
  bias.logit_bias = {{7, 30.0f}, {11, -100.0f}, {4999, 12.5f}};
  bias.logprobs = true;
  c.push_back({"logit_bias", bias, 5000});
  return c;
}

// The prompt and history the penalty cases see: tokens the head makes likely, so they matter.
std::vector<std::int32_t> history_for(const std::vector<float>& logits, std::size_t count) {
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
  order.resize(count);
  return order;
}

TEST(GpuSampler, AgreesWithTheCpuSamplerTokenForToken) {
  constexpr int kRows = 32, kRounds = 9;  // 288 draws a case, over 4,000 in all
  std::size_t draws_checked = 0;
  for (const Case& c : cases()) {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<Draw> draws;
      for (int r = 0; r < kRows; ++r) {
        SamplingParams p = c.params;
        p.seed = 1000003ull * round + static_cast<std::uint64_t>(r) * 7919ull + 1;
        auto logits = model_like(c.vocab, p.seed ^ 0x5eedull, c.spread, c.ties);
        const auto history = history_for(logits, 6);
        Sampler sampler(p, std::span(history).first(3));
        for (std::size_t h = 3; h < history.size(); ++h) sampler.accept(history[h]);
        draws.push_back({std::move(logits), std::move(sampler)});
      }
      const auto gpu = gpu_draws(draws);
      for (int r = 0; r < kRows; ++r) {
        const SampledToken cpu = draws[r].sampler.sample(draws[r].logits);
        ASSERT_EQ(gpu[r].token, cpu.token) << c.name << ", round " << round << ", row " << r;
        ASSERT_EQ(gpu[r].logprob.has_value(), cpu.logprob.has_value()) << c.name;
        if (cpu.logprob) {
          EXPECT_NEAR(*gpu[r].logprob, *cpu.logprob, 2e-4) << c.name;
        }
        ASSERT_EQ(gpu[r].top_logprobs.size(), cpu.top_logprobs.size()) << c.name;
        for (std::size_t a = 0; a < cpu.top_logprobs.size(); ++a) {
          EXPECT_EQ(gpu[r].top_logprobs[a].token, cpu.top_logprobs[a].token) << c.name << ", alternative " << a;
          EXPECT_NEAR(gpu[r].top_logprobs[a].logprob, cpu.top_logprobs[a].logprob, 2e-4) << c.name;
        }
        ++draws_checked;
      }
    }
  }
  EXPECT_GE(draws_checked, 4000u);
}

TEST(GpuSampler, AVocabularyOfLlama3SizeAndRowsOfDifferentLengths) {
  std::vector<Draw> draws;
  for (int r = 0; r < 6; ++r) {
    SamplingParams p = with(r % 2 == 0 ? 0.7f : 1.0f, 0, r % 3 == 0 ? 1.0f : 0.95f, 0.0f);
    p.seed = 77 + static_cast<std::uint64_t>(r);
    const std::size_t n = r < 3 ? 128256 : 128000 - 1000 * r;  // padding rows past the shorter ones
    draws.push_back({model_like(n, p.seed), Sampler(p)});
  }
  const auto gpu = gpu_draws(draws);
  for (std::size_t r = 0; r < draws.size(); ++r) EXPECT_EQ(gpu[r].token, draws[r].sampler.sample(draws[r].logits).token);
}

// Flat rows of a llama3-sized vocabulary: the kept tokens spread over every chunk of the row, so
// the whole-row draws (from STATS' sums, or after a threshold) land anywhere in it.
TEST(GpuSampler, FlatRowsOfLlama3SizeDrawAcrossTheirChunks) {
  const std::vector<SamplingParams> shapes{with(1.0f, 0, 1.0f, 0.0f), with(0.7f, 0, 1.0f, 0.02f),
                                           with(0.7f, 0, 0.95f, 0.0f), with(1.5f, 3000, 1.0f, 0.0f)};
  std::vector<Draw> draws;
  for (std::size_t i = 0; i < 4 * shapes.size(); ++i) {
    SamplingParams p = shapes[i % shapes.size()];
    p.seed = 900 + i;
    draws.push_back({model_like(128256, p.seed / 4, 0.5f), Sampler(p)});
  }
  const auto gpu = gpu_draws(draws);
  std::set<std::int32_t> chunks;
  for (std::size_t r = 0; r < draws.size(); ++r) {
    const std::int32_t cpu = draws[r].sampler.sample(draws[r].logits).token;
    EXPECT_EQ(gpu[r].token, cpu) << "row " << r;
    chunks.insert(cpu / 4096);
  }
  EXPECT_GE(chunks.size(), 8u);  // the draws did not all land in a few chunks
}

TEST(GpuSampler, TheTokenBeforeStillOnTheGpuCountsForThePenaltiesAndTheCounter) {
  for (int trial = 0; trial < 24; ++trial) {
    SamplingParams p = with(0.6f, 0, 1.0f, 0.0f);
    p.seed = 500 + static_cast<std::uint64_t>(trial);
    p.repetition_penalty = 2.0f;
    p.repetition_last_n = trial % 2 == 0 ? 4 : 64;
    p.presence_penalty = 1.5f;
    p.frequency_penalty = 1.0f;
    p.logprobs = true;
    auto logits = model_like(2000, p.seed);
    const auto likely = history_for(logits, 5);
    Sampler gpu_side(p), cpu_side(p);
    for (int h = 0; h < 4; ++h) {
      gpu_side.accept(likely[h]);
      cpu_side.accept(likely[h]);
    }
    // The step before chose likely[trial % 5]: the CPU sampler has accepted it, the GPU's row
    // only names it as pending.
    const std::int32_t before = likely[trial % 5];
    cpu_side.accept(before);
    std::vector<Draw> draws;
    draws.push_back({logits, std::move(gpu_side), before});
    const auto gpu = gpu_draws(draws);
    const SampledToken cpu = cpu_side.sample(logits);
    EXPECT_EQ(gpu[0].token, cpu.token) << "trial " << trial;
    EXPECT_NEAR(*gpu[0].logprob, *cpu.logprob, 2e-4) << "trial " << trial;
  }
}

TEST(GpuSampler, NothingFiniteIsAnErrorForTheRowAlone) {
  SamplingParams p = with(0.8f, 0, 1.0f, 0.0f);
  std::vector<Draw> draws;
  draws.push_back({std::vector<float>(100, std::numeric_limits<float>::quiet_NaN()), Sampler(p)});
  EXPECT_THROW(gpu_draws(draws), std::runtime_error);
}

TEST(GpuSampler, DrawsFollowTheDistributionByChiSquare) {
  struct Shape {
    SamplingParams params;
  };
  const std::vector<Shape> shapes{{with(1.0f, 0, 1.0f, 0.0f)}, {with(0.8f, 0, 0.9f, 0.0f)}, {with(1.2f, 12, 1.0f, 0.0f)}};
  const auto logits = model_like(40, 9, 1.0f);
  for (const Shape& s : shapes) {
    const auto expected = testing::kept_distribution(logits, s.params);
    constexpr int kDraws = 6000;
    std::vector<int> counts(logits.size(), 0);
    std::vector<Draw> draws;
    for (int d = 0; d < kDraws; ++d) {
      SamplingParams p = s.params;
      p.seed = 31337 + static_cast<std::uint64_t>(d);
      draws.push_back({logits, Sampler(p)});
    }
    for (const SampledToken& t : gpu_draws(draws)) ++counts[t.token];
    // Infinite where a token outside the kept set was drawn.
    const auto [chi2, df] = testing::chi_square(counts, expected, kDraws);
    EXPECT_LT(chi2, testing::critical_value(df)) << "temperature " << s.params.temperature << ", top_k "
                                                  << s.params.top_k << ", top_p " << s.params.top_p << ": df " << df;
  }
}

}  // namespace
}  // namespace mqlm::model
