// The GPU forward pass against the CPU reference on tiny models of each architecture and weight
// type (lavapipe here): a prefill, decode steps, and one step that mixes a prefill chunk of one
// sequence with decode tokens of two others whose cache pages are scattered.
//
// Bound: the largest logit difference, divided by the largest reference logit, below 2e-2.
// The GPU keeps K and V in F16 and sums in F32 in another order; the reference is F32 / F64.
#include <gtest/gtest.h>

#include <cmath>

#include "memory_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace mqlm::model {
namespace {

using gpu::WeightType;
using testing::random_model;
using testing::tiny;

constexpr double kBound = 2e-2;

double normalised_error(std::span<const float> gpu, std::span<const float> reference) {
  double worst = 0, scale = 1e-6;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    if (!std::isfinite(gpu[i])) return INFINITY;
    worst = std::max(worst, std::abs(double(gpu[i]) - reference[i]));
    scale = std::max(scale, std::abs(double(reference[i])));
  }
  return worst / scale;
}

class GpuModelTest : public ::testing::TestWithParam<std::tuple<Architecture, WeightType>> {};

TEST_P(GpuModelTest, MatchesTheReference) {
  auto [arch, type] = GetParam();
  LlamaConfig config = tiny(arch, 64);
  config.n_ff = 512;  // Q4_K rows need multiples of 256
  config.n_vocab = 300;
  auto weights = random_model(config, type, 11, /*tied=*/arch == Architecture::qwen3);
  ReferenceModel reference = ReferenceModel::load(config, weights.source());

  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, weights.source(), "weights:tiny");
  constexpr std::uint32_t kPageSize = 4;
  GpuKvCache cache(ctx, config, 16, kPageSize);

  // Three sequences; their pages interleave in the cache.
  const std::vector<std::vector<std::int32_t>> prompts{{1, 2, 3, 4, 5, 6, 7}, {9, 8}, {100, 200, 299, 0, 42}};
  StepBatch layout;
  layout.block_tables = {{3, 0, 7, 12}, {5, 9, 1, 2}, {4, 6, 8, 10}};
  std::vector<ReferenceSequence> refs;
  for (std::size_t s = 0; s < prompts.size(); ++s) refs.emplace_back(reference);

  auto step = [&](std::vector<StepToken> tokens) {
    StepBatch batch = layout;
    batch.tokens = std::move(tokens);
    return model.forward(batch, cache);
  };

  // Step 1: sequence 0 prefills all its prompt, every row wanted.
  std::vector<StepToken> prefill;
  for (std::uint32_t p = 0; p < prompts[0].size(); ++p) prefill.push_back({0, p, prompts[0][p], true});
  auto gpu_logits = step(prefill);
  auto ref_logits = refs[0].forward(prompts[0]);
  EXPECT_LT(normalised_error(gpu_logits, ref_logits), kBound) << "prefill";

  // Step 2: sequence 1 prefills, sequence 2 prefills a chunk of 3, sequence 0 decodes one token;
  // only the last row of each is wanted.
  std::vector<StepToken> mixed{{1, 0, 9, false}, {1, 1, 8, true}, {2, 0, 100, false}, {2, 1, 200, false},
                               {2, 2, 299, true}, {0, 7, 13, true}};
  gpu_logits = step(mixed);
  ASSERT_EQ(gpu_logits.size(), 3u * config.n_vocab);
  std::vector<float> expected;
  auto last_row = [&](const std::vector<float>& all) {
    expected.insert(expected.end(), all.end() - config.n_vocab, all.end());
  };
  last_row(refs[1].forward(prompts[1]));
  last_row(refs[2].forward(std::span(prompts[2]).first(3)));
  const std::int32_t thirteen = 13;
  last_row(refs[0].forward(std::span(&thirteen, 1)));
  EXPECT_LT(normalised_error(gpu_logits, expected), kBound) << "mixed step";

  // Steps 3..8: all three decode together, feeding back the reference's greedy choice.
  std::vector<std::uint32_t> next_pos{8, 2, 3};
  std::vector<std::int32_t> next_tok{5, 77, 0};
  for (int round = 0; round < 6; ++round) {
    std::vector<StepToken> decode;
    for (std::uint32_t s = 0; s < 3; ++s) decode.push_back({s, next_pos[s], next_tok[s], true});
    gpu_logits = step(decode);
    expected.clear();
    for (std::uint32_t s = 0; s < 3; ++s) {
      auto r = refs[s].forward(std::span(&next_tok[s], 1));
      expected.insert(expected.end(), r.begin(), r.end());
      next_tok[s] = static_cast<std::int32_t>(std::max_element(r.begin(), r.end()) - r.begin());
      ++next_pos[s];
    }
    EXPECT_LT(normalised_error(gpu_logits, expected), kBound) << "decode round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(
    ArchitecturesAndTypes, GpuModelTest,
    ::testing::Combine(::testing::Values(Architecture::llama, Architecture::qwen2, Architecture::qwen3),
                       ::testing::Values(WeightType::f32, WeightType::f16, WeightType::bf16, WeightType::q8_0,
                                         WeightType::q4_0, WeightType::q4_k)),
    [](const auto& info) {
      return std::string(architecture_name(std::get<0>(info.param))) + "_" +
             std::string(gpu::weight_type_name(std::get<1>(info.param)));
    });

// Deeper than one submission's worth of layers: the step goes to the GPU in parts, each waiting
// for the one before; the logits are the same bits as from one submission, and near the reference
// (19 layers of random weights let the F16 KV cache's rounding grow: the bound is looser here).
TEST(GpuModelDeep, StepsSplitIntoSeveralSubmissionsGiveTheSameLogits) {
  LlamaConfig config = tiny(Architecture::llama, 64);
  config.n_layers = 19;
  config.n_vocab = 120;
  auto weights = random_model(config, WeightType::f16, 4);
  ReferenceModel reference = ReferenceModel::load(config, weights.source());
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, weights.source(), "weights:deep");
  const std::vector<std::int32_t> prompt{3, 1, 4, 1, 5, 9, 2, 6};
  auto run = [&](std::uint32_t layers_per_submission) {
    model.set_layers_per_submission(layers_per_submission);
    GpuKvCache cache(ctx, config, 4, 8);
    StepBatch batch;
    batch.block_tables = {{1, 3, 0, 2}};
    for (std::uint32_t i = 0; i < prompt.size(); ++i) batch.tokens.push_back({0, i, prompt[i], true});
    auto logits = model.forward(batch, cache);
    batch.tokens = {{0, 8, 7, true}};
    auto next = model.forward(batch, cache);
    logits.insert(logits.end(), next.begin(), next.end());
    return logits;
  };
  auto whole = run(1000);
  EXPECT_EQ(run(3), whole);
  EXPECT_EQ(run(8), whole);
  ReferenceSequence seq(reference);
  auto expected = seq.forward(prompt);
  const std::int32_t seven = 7;
  auto next = seq.forward(std::span(&seven, 1));
  expected.insert(expected.end(), next.begin(), next.end());
  EXPECT_LT(normalised_error(whole, expected), 0.15);
}

// Greedy decoding picks on the GPU what the host would pick from the logits.
TEST(GpuModelArgmax, MatchesTheArgmaxOfTheLogits) {
  LlamaConfig config = tiny(Architecture::qwen3, 64);
  config.n_vocab = 500;
  auto weights = random_model(config, WeightType::q8_0, 8);
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, weights.source(), "weights:argmax");
  GpuKvCache cache(ctx, config, 8, 4);
  StepBatch batch;
  batch.block_tables = {{0, 1, 2}, {5, 4, 3}};
  batch.tokens = {{0, 0, 10, true}, {0, 1, 11, true}, {1, 0, 499, false}, {1, 1, 0, true}};
  auto logits = model.forward(batch, cache);
  auto ids = model.forward_argmax(batch, cache);  // the same step again writes the same K and V
  ASSERT_EQ(ids.size(), 3u);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    auto row = std::span(logits).subspan(r * config.n_vocab, config.n_vocab);
    EXPECT_EQ(ids[r], std::max_element(row.begin(), row.end()) - row.begin()) << "row " << r;
  }
}

TEST(GpuModelLoad, RefusesHeadSizesTheAttentionKernelLacks) {
  LlamaConfig config = tiny(Architecture::llama, 16);
  auto weights = random_model(config, WeightType::f32, 1);
  auto& g = gpu::testing::shared_gpu();
  EXPECT_THROW(GpuModel({g.queue, g.pool, g.kernels}, config, weights.source(), "weights:x"), std::runtime_error);
}

TEST(GpuModelLoad, WeightsAreAccountedToTheModelAndFreedWithIt) {
  auto& g = gpu::testing::shared_gpu();
  LlamaConfig config = tiny(Architecture::llama, 64);
  auto weights = random_model(config, WeightType::q8_0, 2);
  {
    GpuModel model({g.queue, g.pool, g.kernels}, config, weights.source(), "weights:accounted");
    auto stats = g.pool.stats();
    ASSERT_TRUE(stats.active_by_owner.contains("weights:accounted"));
    std::uint64_t file_bytes = 0;
    for (const auto& [name, t] : weights.tensors) file_bytes += t.second.size();
    EXPECT_GE(stats.active_by_owner.at("weights:accounted"), file_bytes);
  }
  EXPECT_FALSE(g.pool.stats().active_by_owner.contains("weights:accounted"));
}

}  // namespace
}  // namespace mqlm::model
