// The GPU forward pass against the CPU reference on tiny models of each architecture and weight
// type (lavapipe here): a prefill, decode steps, and one step that mixes a prefill chunk of one
// sequence with decode tokens of two others whose cache pages are scattered.
//
// Bound: the largest logit difference, divided by the largest reference logit, below 2e-2.
// The GPU keeps K and V in F16 and sums in F32 in another order; the reference is F32 / F64.
// Where the GPU's mat-vecs quantize activations to int8 (Q8_0, Q4_0), the reference does too, and
// the bound is 6e-2: rounding to int8 is discontinuous, so the small differences above round a few
// activations the other way, and random weights amplify that over the layers (3.8% seen on
// lavapipe; 22% when the reference does not quantize, so the bound still tells the two apart).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <set>
#include <span>

#include <fmt/format.h>

#include "memory_model.hpp"
#include "gpu/ops.hpp"
#include "model/llama/gpu_model.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace mqlm::model {
namespace {

using gpu::WeightType;
using testing::random_model;
using testing::tiny;

constexpr double kBound = 2e-2;
constexpr double kInt8Bound = 6e-2;

double normalised_error(std::span<const float> gpu, std::span<const float> reference) {
  double worst = 0, scale = 1e-6;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    if (!std::isfinite(gpu[i])) return INFINITY;
    worst = std::max(worst, std::abs(double(gpu[i]) - reference[i]));
    scale = std::max(scale, std::abs(double(reference[i])));
  }
  return worst / scale;
}

// Three sequences through a model of `config` with weights of `type`: a prefill, a step mixing
// prefill chunks and a decode token, and decode steps of all three; each step's logits near the
// reference's.
void expect_steps_match_the_reference(const LlamaConfig& config, WeightType type, bool tied) {
  auto weights = random_model(config, type, 11, tied);
  ReferenceModel reference = ReferenceModel::load(config, weights.source());

  auto& g = gpu::testing::shared_gpu();
  // Every step here is at most 8 tokens: the mat-vec path, int8 activations for Q8_0 and Q4_0.
  reference.int8_activations = gpu::ops::matvec_int8(g.device.features(), type);
  const double bound = reference.int8_activations ? kInt8Bound : kBound;
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
  EXPECT_LT(normalised_error(gpu_logits, ref_logits), bound) << "prefill";

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
  EXPECT_LT(normalised_error(gpu_logits, expected), bound) << "mixed step";

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
    EXPECT_LT(normalised_error(gpu_logits, expected), bound) << "decode round " << round;
  }
}

class GpuModelTest : public ::testing::TestWithParam<std::tuple<Architecture, WeightType>> {};

TEST_P(GpuModelTest, MatchesTheReference) {
  auto [arch, type] = GetParam();
  LlamaConfig config = tiny(arch, 64);
  config.n_ff = 512;  // Q4_K rows need multiples of 256
  config.n_vocab = 300;
  expect_steps_match_the_reference(config, type, /*tied=*/arch == Architecture::qwen3);
}

// A mixture of experts (4 of 256, 2 a token): qwen3moe, and llama with experts (Mixtral). The
// steps' pairs take the mat-vec (up to 8 tokens a step), each its expert's rows. F32 and F16
// weights: with int8 activations (Q8_0, Q4_K) the GPU's and the reference's hidden states differ
// by enough to change a token's expert where two router logits are under 0.1 apart, as this
// model's random routers have them (Mixtral Q8_0: layer 1's logits 3.589 and 3.491 for the first
// token, which came out 0.32 apart); the quantized files are compared with llama.cpp instead
// (llamacpp_logits_test's ExpertsFile, whose routers pick by clear margins).
class GpuModelExperts : public ::testing::TestWithParam<std::tuple<Architecture, WeightType>> {};

// n_embd 256, 4 experts of 256, 2 a token.
LlamaConfig experts_config(Architecture arch) {
  LlamaConfig config = tiny(arch, 64);
  config.n_expert = 4;
  config.n_expert_used = 2;
  config.n_ff_exp = 256;
  config.n_vocab = 300;
  return config;
}

TEST_P(GpuModelExperts, MatchesTheReference) {
  auto [arch, type] = GetParam();
  expect_steps_match_the_reference(experts_config(arch), type, false);
}

// A wide step (more than 8 tokens): the pairs grouped by expert (moe_sort) and multiplied a tile of
// pairs at a time, by mul_mm_id on lavapipe and on the tensor cores where the device has them (F16
// experts; n_embd 256 and experts of 256, K a multiple of 128 both ways), against the same prompt
// prefilled 8 tokens a step (the mat-vec per pair, which MatchesTheReference checks) into other
// pages: 40 tokens (320 pairs, ~80 an expert: tiles of 64 and of 16 both cut experts in several),
// every row's logits. The two ways differ by 4e-5 to 2e-4 on lavapipe (a dense model's 40-token step
// and 8-token steps by as much: the K/V of earlier steps come back rounded to F16); against the CPU
// reference instead, that rounding can move a router logit past a near-tie (it did with head_dim 32,
// mixtral F16: token 4's row 0.05 off).
TEST_P(GpuModelExperts, WideStepMatchesNarrowSteps) {
  auto [arch, type] = GetParam();
  const LlamaConfig config = experts_config(arch);
  auto weights = random_model(config, type, 11, false);
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, weights.source(), "weights:tiny");
  constexpr std::uint32_t kPageSize = 4, kTokens = 40;
  GpuKvCache cache(ctx, config, 20, kPageSize);
  StepBatch wide, narrow;
  wide.block_tables = narrow.block_tables = {{11, 0, 10, 1, 9, 2, 8, 3, 7, 4}, {5, 19, 6, 18, 12, 17, 13, 16, 14, 15}};
  std::vector<float> chunked;
  for (std::uint32_t p = 0; p < kTokens; ++p) {
    const auto token = static_cast<std::int32_t>((p * 37 + 5) % config.n_vocab);
    wide.tokens.push_back({0, p, token, true});
    narrow.tokens.push_back({1, p, token, true});
    if (narrow.tokens.size() == gpu::ops::matvec_max_columns || p + 1 == kTokens) {
      const auto logits = model.forward(narrow, cache);
      chunked.insert(chunked.end(), logits.begin(), logits.end());
      narrow.tokens.clear();
    }
  }
  const auto gpu_logits = model.forward(wide, cache);
  EXPECT_LT(normalised_error(gpu_logits, chunked), 1e-3);
}

// A wide step of quantized experts on the tensor cores (skipped where the device has none, as on
// lavapipe): every expert's matrices decoded to F16 first (KernelChoice::experts_f16) against the
// weights decoded in each tile (never), 40 tokens of Q4_K, Q8_0 and Q6_K weights. Both decode a
// block to the same halves and multiply them in the same tiles and order; decoded first, gate and
// up then make silu(gate) * up in one dispatch (ops::matmul_experts_glu) where the other way has a
// dispatch of its own for it: the same logits but for rounding.
TEST(GpuModelExpertsF16, DecodingFirstMatchesDecodingInTheTiles) {
  const LlamaConfig config = experts_config(Architecture::qwen3moe);
  auto& g = gpu::testing::shared_gpu();
  if (!gpu::ops::experts_coopmat_applies(g.device.features(), WeightType::q4_k, config.n_ff_exp, config.n_embd)) {
    GTEST_SKIP() << "no tensor-core expert products on this device";
  }
  for (WeightType type : {WeightType::q4_k, WeightType::q8_0, WeightType::q6_k}) {
    auto weights = random_model(config, type, 11, false);
    GpuContext ctx{g.queue, g.pool, g.kernels};
    GpuModel model(ctx, config, weights.source(), "weights:tiny");
    GpuKvCache cache(ctx, config, 10, 4);
    StepBatch batch;
    batch.block_tables = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}};
    for (std::uint32_t p = 0; p < 40; ++p) batch.tokens.push_back({0, p, static_cast<std::int32_t>((p * 37 + 5) % 300), true});
    std::vector<float> logits[2];
    for (bool f16 : {false, true}) {
      gpu::ops::KernelChoice choice;
      choice.experts_f16 = f16;
      model.set_kernel_choice(choice);
      logits[f16] = model.forward(batch, cache);
    }
    EXPECT_LT(normalised_error(logits[1], logits[0]), 1e-4) << gpu::weight_type_name(type);
  }
}

// Decode steps of quantized experts in two dispatches after the router (each token routed in the
// products, silu(gate) * up made by gate and up: KernelChoice::experts_fused, the default) give the
// logits of the four dispatches they replace (moe_route, gate and up, quantize_q8_silu, down with
// the sum), bit for bit: a 7-token prompt, then steps of 1 and of 3 tokens, qwen3moe and Mixtral,
// Q8_0, Q4_K and IQ4_XS experts. The profile's labels say which way each ran.
TEST(GpuModelExpertsFused, GiveTheLogitsOfTheSeparateDispatches) {
  auto& g = gpu::testing::shared_gpu();
  if (!g.device.features().integer_dot_product) GTEST_SKIP() << "no integer dot products on this device";
  GpuContext ctx{g.queue, g.pool, g.kernels};
  for (Architecture arch : {Architecture::qwen3moe, Architecture::llama}) {
    for (WeightType type : {WeightType::q8_0, WeightType::q4_k, WeightType::iq4_xs}) {
      const LlamaConfig config = experts_config(arch);
      auto weights = random_model(config, type, 12, false);
      GpuModel model(ctx, config, weights.source(), "weights:tiny");
      auto run = [&](bool fused, StepProfile& profile) {
        gpu::ops::KernelChoice choice;
        choice.experts_fused = fused;
        model.set_kernel_choice(choice);
        GpuKvCache cache(ctx, config, 8, 4);
        StepBatch batch;
        batch.block_tables = {{5, 0, 7}, {1, 6, 2}};
        for (std::uint32_t p = 0; p < 7; ++p) batch.tokens.push_back({0, p, static_cast<std::int32_t>(p * 41 % 300), true});
        std::vector<float> logits = model.forward(batch, cache, &profile);
        for (const auto& tokens : {std::vector<StepToken>{{0, 7, 13, true}},
                                   std::vector<StepToken>{{0, 8, 250, true}, {1, 0, 9, true}, {1, 1, 99, true}}}) {
          batch.tokens = tokens;
          const auto more = model.forward(batch, cache, &profile);
          logits.insert(logits.end(), more.begin(), more.end());
        }
        return logits;
      };
      const std::string what = fmt::format("{} {}", architecture_name(arch), gpu::weight_type_name(type));
      StepProfile fused_profile, separate_profile;
      const std::vector<float> fused = run(true, fused_profile), separate = run(false, separate_profile);
      EXPECT_EQ(fused, separate) << what;
      EXPECT_TRUE(fused_profile.gpu_ms.contains("matmul experts gate, up, silu")) << what;
      EXPECT_FALSE(fused_profile.gpu_ms.contains("route")) << what;
      EXPECT_TRUE(separate_profile.gpu_ms.contains("route")) << what;
      EXPECT_FALSE(separate_profile.gpu_ms.contains("matmul experts gate, up, silu")) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    ArchitecturesAndTypes, GpuModelExperts,
    ::testing::Combine(::testing::Values(Architecture::qwen3moe, Architecture::llama),
                       ::testing::Values(WeightType::f32, WeightType::f16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == Architecture::llama ? "mixtral" : "qwen3moe") + "_" +
             std::string(gpu::weight_type_name(std::get<1>(info.param)));
    });

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
// (19 layers of random weights let the F16 KV cache's rounding grow: the bound is looser here, and
// looser again where the products run on tensor cores from F16 activations: 0.161 on the H100).
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
  const bool f16_activations = g.device.features().cooperative_matrix.has_value();
  EXPECT_LT(normalised_error(whole, expected), f16_activations ? 0.2 : 0.15);
}

// One sequence decoding on the int8 path (its q/k/v products writing the cache, the residual
// products adding into x): the logits stay as near the reference as int8 activations allow, for
// llama and for qwen3 (whose q/k norms keep q, k and v apart from the cache writes). The same
// model told to keep F32 activations (a KernelChoice) stays as near the F32 reference as the float
// kernels do.
TEST(GpuModelOneSequence, DecodeMatchesTheReferenceWithAndWithoutInt8) {
  auto& g = gpu::testing::shared_gpu();
  if (!g.device.features().integer_dot_product) GTEST_SKIP() << "no integer dot products on this device";
  const std::vector<std::int32_t> prompt{7, 1, 250, 3, 9}, decoded{11, 51, 91, 131, 171, 211};
  for (Architecture arch : {Architecture::llama, Architecture::qwen3}) {
    for (WeightType type : {WeightType::q4_0, WeightType::q8_0}) {
      LlamaConfig config = tiny(arch, 64);
      config.n_ff = 512;
      config.n_vocab = 300;
      auto weights = random_model(config, type, 12, /*tied=*/false);
      GpuContext ctx{g.queue, g.pool, g.kernels};
      GpuModel model(ctx, config, weights.source(), "weights:one-sequence");
      auto decode = [&] {
        GpuKvCache cache(ctx, config, 4, 4);
        StepBatch batch;
        batch.block_tables = {{2, 0, 3, 1}};
        for (std::uint32_t i = 0; i < prompt.size(); ++i) batch.tokens.push_back({0, i, prompt[i], i + 1 == prompt.size()});
        std::vector<float> logits = model.forward(batch, cache);
        for (std::uint32_t i = 0; i < decoded.size(); ++i) {
          batch.tokens = {{0, static_cast<std::uint32_t>(prompt.size()) + i, decoded[i], true}};
          auto next = model.forward(batch, cache);
          logits.insert(logits.end(), next.begin(), next.end());
        }
        return logits;
      };
      auto expected = [&](bool int8) {
        ReferenceModel reference = ReferenceModel::load(config, weights.source());
        reference.int8_activations = int8;
        ReferenceSequence seq(reference);
        std::vector<float> logits = seq.forward(prompt);
        logits.erase(logits.begin(), logits.end() - config.n_vocab);
        for (std::int32_t token : decoded) {
          auto next = seq.forward(std::span(&token, 1));
          logits.insert(logits.end(), next.begin(), next.end());
        }
        return logits;
      };
      const std::string what = std::string(architecture_name(arch)) + " " + std::string(gpu::weight_type_name(type));
      const std::vector<float> int8 = decode(), want_int8 = expected(true);
      ASSERT_EQ(int8.size(), want_int8.size()) << what;
      EXPECT_LT(normalised_error(int8, want_int8), kInt8Bound) << what;
      gpu::ops::KernelChoice floats;
      floats.matvec_int8 = false;
      model.set_kernel_choice(floats);
      const std::vector<float> f32 = decode(), want_f32 = expected(false);
      EXPECT_LT(normalised_error(f32, want_f32), kBound) << what << " without int8";
      EXPECT_NE(int8, f32) << what << ": the choice changed nothing";
    }
  }
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

// Greedy steps sent ahead (submit_tokens, each taking its tokens on the GPU from the step before,
// sent before that one is collected) give the tokens that steps run one at a time give, for two
// sequences decoding side by side; a step's tokens from a step with another count are refused,
// and a step is collected once.
TEST(GpuModelArgmax, StepsSentAheadGiveTheTokensOfStepsRunInTurn) {
  LlamaConfig config = tiny(Architecture::llama, 64);
  config.n_vocab = 300;
  auto weights = random_model(config, WeightType::q4_0, 9);
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, weights.source(), "weights:ahead");
  const std::vector<std::vector<std::uint32_t>> tables{{3, 0, 5, 1}, {2, 7, 4, 6}};
  constexpr std::uint32_t kSteps = 9, kPrompt = 3;
  auto prefill = [&](GpuKvCache& cache) {
    StepBatch batch{{}, tables, {}};
    for (std::uint32_t s = 0; s < 2; ++s) {
      for (std::uint32_t p = 0; p < kPrompt; ++p) batch.tokens.push_back({s, p, static_cast<std::int32_t>(17 * s + 5 * p + 1), p + 1 == kPrompt});
    }
    return model.forward_argmax(batch, cache);
  };
  auto step = [&](const std::vector<std::int32_t>& tokens, std::uint32_t position) {
    return StepBatch{{{0, position, tokens[0], true}, {1, position, tokens[1], true}}, tables, {}};
  };
  std::vector<std::vector<std::int32_t>> in_turn, ahead;
  {
    GpuKvCache cache(ctx, config, 8, 4);
    std::vector<std::int32_t> next = prefill(cache);
    for (std::uint32_t i = 0; i < kSteps; ++i) {
      next = model.forward_argmax(step(next, kPrompt + i), cache);
      in_turn.push_back(next);
    }
  }
  {
    GpuKvCache cache(ctx, config, 8, 4);
    std::vector<std::int32_t> first = prefill(cache);
    GpuModel::PendingTokens current = model.submit_tokens(step(first, kPrompt), cache);
    for (std::uint32_t i = 1; i <= kSteps; ++i) {
      std::optional<GpuModel::PendingTokens> after;
      if (i < kSteps) after = model.submit_tokens(step({0, 0}, kPrompt + i), cache, &current);
      ahead.push_back(model.collect(current));
      if (after) current = std::move(*after);
    }
    EXPECT_THROW(model.collect(current), std::logic_error);
    GpuModel::PendingTokens one = model.submit_tokens(StepBatch{{{0, kPrompt + kSteps, 1, true}}, tables, {}}, cache);
    EXPECT_THROW(model.submit_tokens(step({0, 0}, kPrompt + kSteps + 1), cache, &one), std::invalid_argument);
    model.collect(one);
  }
  EXPECT_EQ(ahead, in_turn);
  std::set<std::int32_t> distinct;
  for (const auto& t : in_turn) distinct.insert(t[0]);
  EXPECT_GT(distinct.size(), 1u) << "a run of one token says little about where each step's input came from";
}

// Every head size the models use (Gemma's 256, Phi-3's 96, 80, the usual 64 and 128, the small
// ones of tests) against the reference: a prompt of 150 tokens prefilled in two steps (100 tokens,
// then 50 more that see all 150: the split kernel with its keys in three splits), then decode
// steps (five splits of the context each), a head size at a time.
class GpuModelHeadSize : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(GpuModelHeadSize, LongPrefillAndDecodeMatchTheReference) {
  const std::uint32_t d = GetParam();
  LlamaConfig config = tiny(Architecture::llama, d);
  // 256 wide whatever the head size: at 4 x 256, sums of random weights made scores so large that
  // the logits of two steps were 2.7% and 24% off (the F16 cache's rounding choosing the softmax's
  // winners), where the kernel cases of head size 256 match the reference to 1e-9.
  config.n_embd = 256;
  config.n_vocab = 120;
  config.n_ctx_train = 256;
  auto weights = random_model(config, WeightType::f32, 21);
  ReferenceModel reference = ReferenceModel::load(config, weights.source());
  ReferenceSequence seq(reference);
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, weights.source(), "weights:head-size");
  GpuKvCache cache(ctx, config, 12, 16);
  StepBatch batch;
  batch.block_tables = {{11, 0, 10, 1, 9, 2, 8, 3, 7, 4, 6, 5}};
  std::vector<std::int32_t> tokens(153);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 37 + 5) % config.n_vocab);
  auto last_row = [&](const std::vector<float>& all) { return std::vector<float>(all.end() - config.n_vocab, all.end()); };
  for (auto [from, to] : {std::pair{0u, 100u}, {100u, 150u}, {150u, 151u}, {151u, 152u}, {152u, 153u}}) {
    batch.tokens.clear();
    for (std::uint32_t i = from; i < to; ++i) batch.tokens.push_back({0, i, tokens[i], i + 1 == to});
    const auto got = model.forward(batch, cache);
    const auto want = last_row(seq.forward(std::span(tokens).subspan(from, to - from)));
    EXPECT_LT(normalised_error(got, want), kBound) << "head size " << d << ", positions " << from << " to " << to;
  }
}

INSTANTIATE_TEST_SUITE_P(HeadSizes, GpuModelHeadSize, ::testing::Values(16u, 32u, 64u, 80u, 96u, 128u, 256u));

// RoPE as models turn and stretch it, against the reference, past the original context: partial
// rotary dims in the normal layout (llama) and NeoX's (qwen3), linear scaling, YaRN and per-pair
// frequency factors (Llama 3.1's). A prompt of 60 tokens (rope_kv_write), then decode
// steps, in F16 and in Q8_0 (whose products of up to 8 tokens turn q and k as they write them in
// the normal layout, where the device has integer dot products). Each changes the logits: a
// scaling that did nothing fails.
struct RopeCase {
  const char* name;
  Architecture arch;
  std::uint32_t rope_dims = 0;
  float rope_scale = 1.0f;
  float yarn_ext_factor = 0.0f;
  float yarn_attn_factor = 1.0f;
  bool llama3_factors = false;
};
const RopeCase kRopeCases[] = {{"partial_normal", Architecture::llama, 32},
                               {"partial_neox", Architecture::qwen3, 16},
                               {"linear", Architecture::llama, 0, 4.0f},
                               {"yarn_normal", Architecture::llama, 0, 4.0f, 1.0f, 0.9f},
                               {"yarn_neox_partial", Architecture::qwen2, 32, 8.0f, 1.0f},
                               {"llama3_factors", Architecture::llama, 0, 1.0f, 0.0f, 1.0f, true}};

class GpuModelRope : public ::testing::TestWithParam<std::tuple<RopeCase, WeightType>> {};

TEST_P(GpuModelRope, MatchesTheReferenceAndChangesTheLogits) {
  auto [rope, type] = GetParam();
  LlamaConfig plain = tiny(rope.arch, 64);
  plain.n_vocab = 120;
  plain.n_ctx_train = 16;  // the original context the scaling stretches
  LlamaConfig config = plain;
  config.rope_dims = rope.rope_dims;
  config.rope_scale = rope.rope_scale;
  config.yarn_ext_factor = rope.yarn_ext_factor;
  config.yarn_attn_factor = rope.yarn_attn_factor;
  if (rope.llama3_factors) {
    for (std::uint32_t i = 0; i < 32; ++i) config.rope_freq_factors.push_back(i < 8 ? 1.0f : i < 16 ? 2.5f : 8.0f);
  }
  auto weights = random_model(config, type, 23);
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  std::vector<std::int32_t> tokens(64);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 53 + 11) % plain.n_vocab);
  // The reference quantizes every product's activations where the GPU's mat-vecs do (up to 8
  // tokens): Q8_0's prompt goes in steps of 8, F16's in one.
  const bool int8 = gpu::ops::matvec_int8(g.device.features(), type);
  const std::uint32_t chunk = int8 ? 8 : 60;
  auto run = [&](const LlamaConfig& c) {  // (5, n_vocab): the prompt's last token, then four decoded
    GpuModel model(ctx, c, weights.source(), "weights:rope");
    GpuKvCache cache(ctx, c, 4, 16);
    StepBatch batch;
    batch.block_tables = {{3, 1, 0, 2}};
    std::vector<float> logits;
    for (std::uint32_t from = 0; from < 60; from += chunk) {
      batch.tokens.clear();
      for (std::uint32_t i = from; i < std::min(from + chunk, 60u); ++i) batch.tokens.push_back({0, i, tokens[i], i == 59});
      logits = model.forward(batch, cache);
    }
    for (std::uint32_t i = 60; i < 64; ++i) {
      batch.tokens = {{0, i, tokens[i], true}};
      const auto next = model.forward(batch, cache);
      logits.insert(logits.end(), next.begin(), next.end());
    }
    return logits;
  };
  ReferenceModel reference = ReferenceModel::load(config, weights.source());
  reference.int8_activations = int8;
  ReferenceSequence seq(reference);
  std::vector<float> want = seq.forward(std::span(tokens).first(60));
  want.erase(want.begin(), want.end() - plain.n_vocab);
  for (std::uint32_t i = 60; i < 64; ++i) {
    const auto next = seq.forward(std::span(tokens).subspan(i, 1));
    want.insert(want.end(), next.begin(), next.end());
  }
  const std::vector<float> got = run(config);
  const std::string what = fmt::format("{} {}", rope.name, gpu::weight_type_name(type));
  EXPECT_LT(normalised_error(got, want), reference.int8_activations ? kInt8Bound : kBound) << what;
  EXPECT_GT(normalised_error(run(plain), got), 0.1) << what << ": the scaling changed little";
}

INSTANTIATE_TEST_SUITE_P(Scalings, GpuModelRope,
                         ::testing::Combine(::testing::ValuesIn(kRopeCases),
                                            ::testing::Values(WeightType::f16, WeightType::q8_0)),
                         [](const auto& info) {
                           return fmt::format("{}_{}", std::get<0>(info.param).name,
                                              gpu::weight_type_name(std::get<1>(info.param)));
                         });

TEST(GpuModelLoad, RefusesHeadSizesTheAttentionKernelLacks) {
  LlamaConfig config = tiny(Architecture::llama, 272);
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

// Whole KV pages copied out to the host and back into other page slots: what the prefix cache
// does when it evicts pages and later restores a returning prompt's prefix. Run once copying as
// the device allows (through the mapping on lavapipe) and once always through staging, the path
// of a device whose memory the host cannot map (an H200's), in chunks that cut page regions.
class KvPageCopy : public ::testing::TestWithParam<bool> {
 protected:
  static constexpr std::uint32_t kPageSize = 4;
  static LlamaConfig config() {
    LlamaConfig c = tiny(Architecture::llama, 64);
    c.n_vocab = 120;
    return c;
  }
  KvPageCopy()
      : weights_(random_model(config(), WeightType::f16, 21)),
        model_(ctx_, config(), weights_.source(), "weights:kv-pages"),
        cache_(ctx_, config(), 16, kPageSize) {
    // 2500 bytes: each page region (1 KiB here) is cut somewhere, and several chunks take turns
    // with the two staging buffers.
    if (GetParam()) cache_.set_page_staging(2500, true);
  }
  // Runs `tokens` of one sequence at positions from `first`; the last token's logits.
  std::vector<float> run(const std::vector<std::uint32_t>& block_table, std::span<const std::int32_t> tokens,
                         std::uint32_t first) {
    StepBatch batch;
    batch.block_tables = {block_table};
    for (std::uint32_t i = 0; i < tokens.size(); ++i) {
      batch.tokens.push_back({0, first + i, tokens[i], i + 1 == tokens.size()});
    }
    return model_.forward(batch, cache_);
  }
  std::vector<std::vector<std::byte>> read(std::span<const std::uint32_t> pages) {
    std::vector<std::vector<std::byte>> bytes(pages.size(), std::vector<std::byte>(cache_.page_bytes()));
    std::vector<std::span<std::byte>> out(bytes.begin(), bytes.end());
    cache_.read_pages(pages, out);
    return bytes;
  }
  void write(std::span<const std::uint32_t> pages, const std::vector<std::vector<std::byte>>& bytes) {
    std::vector<std::span<const std::byte>> data(bytes.begin(), bytes.end());
    cache_.write_pages(pages, data);
  }

  gpu::testing::Gpu& g_ = gpu::testing::shared_gpu();
  GpuContext ctx_{g_.queue, g_.pool, g_.kernels};
  testing::MemoryModel weights_;
  GpuModel model_;
  GpuKvCache cache_;
};

TEST_P(KvPageCopy, PagesRoundTripThroughTheHost) {
  const LlamaConfig c = config();
  ASSERT_EQ(cache_.page_bytes(), std::uint64_t{c.n_layers} * 2 * kPageSize * c.kv_dim() * 2);
  const std::vector<std::int32_t> prompt{5, 17, 3, 99, 42, 8, 0, 61, 7, 7, 12};  // pages 2, 6 and part of 3
  run({2, 6, 3}, prompt, 0);
  const std::vector<std::uint32_t> filled{2, 6, 3}, unused{11, 0, 14};
  auto bytes = read(filled);
  for (const auto& page : bytes) {
    EXPECT_TRUE(std::ranges::any_of(page, [](std::byte b) { return b != std::byte{0}; })) << "the prefill wrote K and V";
  }
  write(unused, bytes);
  EXPECT_EQ(read(unused), bytes);
  EXPECT_EQ(read(filled), bytes) << "the source pages are untouched";
  // Pages out of order and one read twice.
  const std::vector<std::uint32_t> mixed{14, 2, 14};
  EXPECT_EQ(read(mixed), (std::vector{bytes[2], bytes[0], bytes[2]}));
}

// The second run of one step's computation on the restored pages is the same computation bit for
// bit: the same kernels on a batch of the same shape, reading K and V rows with the same bits in
// the same order (the block table names other pages, but attention walks positions). So the
// logits are compared exactly.
TEST_P(KvPageCopy, RestoredPrefixGivesTheSameLogits) {
  const std::vector<std::int32_t> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9};  // 3 full pages and 3
  const auto prefix = std::span(prompt).first(3 * kPageSize), rest = std::span(prompt).subspan(3 * kPageSize);
  // Sequence A: the three full pages, then the rest in a second step.
  const std::vector<std::uint32_t> table_a{0, 1, 2, 3};
  run(table_a, prefix, 0);
  const auto logits_a = run(table_a, rest, 3 * kPageSize);

  // Evict A's prefix to the host and restore it into other slots for sequence B.
  const std::vector<std::uint32_t> from{0, 1, 2}, to{9, 12, 5};
  write(to, read(from));
  const auto logits_b = run({9, 12, 5, 7}, rest, 3 * kPageSize);
  EXPECT_EQ(logits_b, logits_a);

  // The prefix's pages matter: without them the same tokens give other logits.
  const std::vector<std::uint32_t> elsewhere{10, 13, 15};
  write(elsewhere, read(std::vector<std::uint32_t>{3, 3, 3}));
  EXPECT_NE(run({10, 13, 15, 8}, rest, 3 * kPageSize), logits_a);
}

// A spill as the executor makes it: the copy out is submitted without waiting, then a step that
// writes into the same pages (another sequence's prefill) is submitted behind it. The copy holds
// the pages as they were before that step, and the step's own results are unchanged by it.
TEST_P(KvPageCopy, ALaterCopyReadsThePagesBeforeTheNextStepWritesThem) {
  const std::vector<std::int32_t> prompt{5, 17, 3, 99, 42, 8, 0, 61, 7, 7, 12, 4};  // 3 full pages
  const std::vector<std::uint32_t> pages{2, 6, 3};
  run(pages, prompt, 0);
  const auto before = read(pages);

  std::vector<std::vector<std::byte>> spilled(pages.size(), std::vector<std::byte>(cache_.page_bytes()));
  std::vector<std::span<std::byte>> out(spilled.begin(), spilled.end());
  gpu::PendingDownload download = cache_.read_pages_later(pages, out);
  ASSERT_NE(download.done, 0u);
  std::size_t copied = 0;
  for (const gpu::HostCopy& c : download.copies) copied += c.bytes;
  ASSERT_EQ(copied, pages.size() * cache_.page_bytes());
  const std::vector<std::int32_t> other{8, 8, 1, 30, 2, 71, 19, 5, 5, 40, 3, 11};
  const auto logits = run(pages, other, 0);  // overwrites all three pages
  ASSERT_GE(g_.queue.completed(), download.done);
  download.copy_out();
  EXPECT_EQ(spilled, before) << "the copy read the pages after the step wrote them";
  EXPECT_NE(read(pages), before) << "the step did not write the pages";
  EXPECT_EQ(run({9, 12, 5}, other, 0), logits);
}

INSTANTIATE_TEST_SUITE_P(Paths, KvPageCopy, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "AlwaysStaged" : "AsTheDeviceAllows"; });

// Copies through staging and through the mapping move the same bytes (lavapipe has both).
TEST(KvPageCopyPaths, StagedAndMappedCopiesAgree) {
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  LlamaConfig config = tiny(Architecture::qwen2, 64);
  GpuKvCache cache(ctx, config, 6, 3);
  std::vector<std::byte> pattern(cache.page_bytes() * 2);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte(i * 7 + i / 251);
  const auto first = std::span<const std::byte>(pattern).first(cache.page_bytes()),
             second = std::span<const std::byte>(pattern).subspan(cache.page_bytes());
  const std::vector<std::uint32_t> pages{4, 1};
  const std::vector<std::span<const std::byte>> data{first, second};
  cache.set_page_staging(1000, true);
  cache.write_pages(pages, data);  // staged in
  cache.set_page_staging(std::size_t{64} << 20, false);
  std::vector<std::byte> back(pattern.size());
  const std::vector<std::span<std::byte>> out{std::span(back).first(cache.page_bytes()),
                                              std::span(back).subspan(cache.page_bytes())};
  cache.read_pages(pages, out);  // mapped (or staged where the device cannot map) out
  EXPECT_EQ(back, pattern);
}

// Thousands of pages go in one submission per staging chunk (not one per page or layer), and
// enough bytes that the host copies them on several threads.
TEST(KvPageCopyPaths, ManyPagesTakeOneSubmissionPerChunk) {
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  const LlamaConfig config = tiny(Architecture::llama, 64);  // 4 KiB a page: 2 layers of K and V
  constexpr std::uint32_t kPages = 10000;
  GpuKvCache cache(ctx, config, kPages + 1, 4);
  constexpr std::size_t kChunk = std::size_t{16} << 20;
  std::vector<std::uint32_t> pages(kPages);
  for (std::uint32_t i = 0; i < kPages; ++i) pages[i] = (i * 7919) % (kPages + 1);  // scattered
  std::vector<std::byte> pattern(kPages * cache.page_bytes()), back(pattern.size());
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte((i * 131) ^ (i >> 12));
  std::vector<std::span<const std::byte>> in;
  std::vector<std::span<std::byte>> out;
  for (std::uint32_t i = 0; i < kPages; ++i) {
    in.push_back(std::span<const std::byte>(pattern).subspan(i * cache.page_bytes(), cache.page_bytes()));
    out.push_back(std::span(back).subspan(i * cache.page_bytes(), cache.page_bytes()));
  }
  const std::uint64_t chunks = (pattern.size() + kChunk - 1) / kChunk;
  for (bool always_stage : {true, false}) {
    cache.set_page_staging(kChunk, always_stage);
    const std::uint64_t before = g.queue.last_submitted();
    cache.write_pages(pages, in);
    std::ranges::fill(back, std::byte{0});
    cache.read_pages(pages, out);
    EXPECT_TRUE(back == pattern) << (always_stage ? "staged" : "as the device allows");  // 40 MB: no diff printed
    if (always_stage) {
      EXPECT_EQ(g.queue.last_submitted() - before, 2 * chunks);
    }
  }
}

TEST(KvPageCopyPaths, RejectsBadPagesAndSizes) {
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuKvCache cache(ctx, tiny(Architecture::llama, 64), 4, 4);
  std::vector<std::byte> page(cache.page_bytes()), short_page(cache.page_bytes() - 2);
  const std::vector<std::span<std::byte>> one{page}, wrong{short_page};
  const std::vector<std::span<const std::byte>> one_in{page}, two_in{page, page}, wrong_in{short_page};
  const std::vector<std::uint32_t> ok{3}, outside{4}, pair{1, 1};
  EXPECT_THROW(cache.read_pages(outside, one), std::invalid_argument);
  EXPECT_THROW(cache.write_pages(outside, one_in), std::invalid_argument);
  EXPECT_THROW(cache.read_pages(ok, wrong), std::invalid_argument);
  EXPECT_THROW(cache.write_pages(ok, wrong_in), std::invalid_argument);
  EXPECT_THROW(cache.write_pages(ok, two_in), std::invalid_argument);  // counts differ
  EXPECT_THROW(cache.write_pages(pair, two_in), std::invalid_argument);  // one page twice
  EXPECT_THROW(cache.set_page_staging(0, true), std::invalid_argument);
  EXPECT_NO_THROW(cache.read_pages(ok, one));
  EXPECT_NO_THROW(cache.write_pages(ok, one_in));
}

}  // namespace
}  // namespace mqlm::model
