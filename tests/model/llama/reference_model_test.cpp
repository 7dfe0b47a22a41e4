// The CPU reference forward pass: prefill in one go, in chunks and token by token agree; the
// residual path computes what it should; each architecture's extras are used; bad models fail
// at load with the tensor named.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "model/llama/reference_model.hpp"
#include "memory_model.hpp"

namespace mqlm::model {
namespace {

using gpu::WeightType;
using testing::MemoryModel;
using testing::random_model;
using testing::tiny;

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tolerance) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i]));
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(double(b[i]))));
  }
  EXPECT_LT(worst, tolerance);
}

class ReferenceModelTest : public ::testing::TestWithParam<std::tuple<Architecture, WeightType>> {};

TEST_P(ReferenceModelTest, PrefillChunksAndDecodeAgree) {
  auto [arch, type] = GetParam();
  LlamaConfig config = tiny(arch);
  MemoryModel weights = random_model(config, type, 7);
  ReferenceModel model = ReferenceModel::load(config, weights.source());
  const std::vector<std::int32_t> prompt{1, 17, 4, 49, 0, 23, 23, 8, 30};

  ReferenceSequence whole(model);
  std::vector<float> all = whole.forward(prompt);
  ASSERT_EQ(all.size(), prompt.size() * config.n_vocab);

  ReferenceSequence chunks(model);
  std::vector<float> pieces;
  for (auto [from, to] : {std::pair{0, 3}, std::pair{3, 7}, std::pair{7, 9}}) {
    auto part = chunks.forward(std::span(prompt).subspan(from, to - from));
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  expect_close(pieces, all, 1e-4);

  ReferenceSequence one_by_one(model);
  std::vector<float> steps;
  for (std::int32_t token : prompt) {
    auto part = one_by_one.forward(std::span(&token, 1));
    steps.insert(steps.end(), part.begin(), part.end());
  }
  expect_close(steps, all, 1e-4);
  EXPECT_EQ(one_by_one.length(), prompt.size());

  // Later tokens matter: the last position's logits differ from a shorter context's.
  ReferenceSequence shorter(model);
  auto other = shorter.forward(std::span(prompt).subspan(1));
  std::vector<float> last_all(all.end() - config.n_vocab, all.end()), last_other(other.end() - config.n_vocab, other.end());
  EXPECT_NE(last_all, last_other);
}

INSTANTIATE_TEST_SUITE_P(
    ArchitecturesAndTypes, ReferenceModelTest,
    ::testing::Combine(::testing::Values(Architecture::llama, Architecture::qwen2, Architecture::qwen3),
                       ::testing::Values(WeightType::f32, WeightType::f16, WeightType::q8_0, WeightType::q4_0)),
    [](const auto& info) {
      return std::string(architecture_name(std::get<0>(info.param))) + "_" +
             std::string(gpu::weight_type_name(std::get<1>(info.param)));
    });

// With the attention and feed-forward outputs zeroed, the residual stream is the embedding:
// logits = output * rmsnorm(embedding(token)) * output_norm, computed here by hand.
TEST(ReferenceModelResidual, ZeroBlocksLeaveTheEmbedding) {
  LlamaConfig config = tiny(Architecture::llama);
  MemoryModel weights = random_model(config, WeightType::f32, 3);
  for (std::uint32_t l = 0; l < config.n_layers; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    weights.put(p + "attn_output.weight", WeightType::f32, config.n_embd, config.q_dim(),
                std::vector<float>(config.n_embd * config.q_dim(), 0.0f));
    weights.put(p + "ffn_down.weight", WeightType::f32, config.n_embd, config.n_ff,
                std::vector<float>(config.n_embd * config.n_ff, 0.0f));
  }
  ReferenceModel model = ReferenceModel::load(config, weights.source());
  ReferenceSequence seq(model);
  const std::int32_t token = 11;
  auto logits = seq.forward(std::span(&token, 1));

  const float* e = &model.token_embd[token * config.n_embd];
  double ss = 0;
  for (std::uint32_t i = 0; i < config.n_embd; ++i) ss += double(e[i]) * e[i];
  double inv = 1.0 / std::sqrt(ss / config.n_embd + config.rms_eps);
  for (std::uint32_t v = 0; v < config.n_vocab; ++v) {
    double expected = 0;
    for (std::uint32_t i = 0; i < config.n_embd; ++i) {
      expected += double(model.output[v * config.n_embd + i]) * e[i] * inv * model.output_norm[i];
    }
    EXPECT_NEAR(logits[v], expected, 1e-4 * (1 + std::abs(expected))) << "token " << v;
  }
}

TEST(ReferenceModelLoad, TiedOutputUsesTheEmbedding) {
  LlamaConfig config = tiny(Architecture::qwen3);
  MemoryModel weights = random_model(config, WeightType::f16, 5, /*tied=*/true);
  ReferenceModel model = ReferenceModel::load(config, weights.source());
  EXPECT_TRUE(model.config.tied_output);
  EXPECT_EQ(&model.output_matrix(), &model.token_embd);
  ReferenceSequence seq(model);
  const std::int32_t token = 3;
  EXPECT_EQ(seq.forward(std::span(&token, 1)).size(), config.n_vocab);
}

TEST(ReferenceModelLoad, ArchitectureExtrasChangeTheResult) {
  // The same weights with Qwen2's biases zeroed and not: the biases are applied.
  LlamaConfig config = tiny(Architecture::qwen2);
  MemoryModel weights = random_model(config, WeightType::f32, 9);
  ReferenceModel with_bias = ReferenceModel::load(config, weights.source());
  for (std::uint32_t l = 0; l < config.n_layers; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    weights.put(p + "attn_q.bias", WeightType::f32, 1, config.q_dim(), std::vector<float>(config.q_dim(), 0.0f));
  }
  ReferenceModel without = ReferenceModel::load(config, weights.source());
  const std::vector<std::int32_t> prompt{5, 6, 7};
  ReferenceSequence a(with_bias), b(without);
  EXPECT_NE(a.forward(prompt), b.forward(prompt));
}

TEST(ReferenceModelLoad, MissingOrMisshapenTensorsAreNamed) {
  LlamaConfig config = tiny(Architecture::llama);
  MemoryModel weights = random_model(config, WeightType::f32, 1);
  weights.tensors.erase("blk.1.ffn_up.weight");
  try {
    ReferenceModel::load(config, weights.source());
    FAIL() << "loaded without blk.1.ffn_up.weight";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_up.weight"), std::string::npos) << e.what();
  }
  weights = random_model(config, WeightType::f32, 1);
  weights.put("blk.0.attn_k.weight", WeightType::f32, 8, config.n_embd, std::vector<float>(8 * config.n_embd, 0.0f));
  try {
    ReferenceModel::load(config, weights.source());
    FAIL() << "loaded a misshapen attn_k";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_k.weight is 8 x 64"), std::string::npos) << e.what();
  }
  config.n_head = 3;  // not a multiple of n_head_kv = 2
  EXPECT_THROW(ReferenceModel::load(config, weights.source()), std::runtime_error);
}

TEST(ReferenceModelLoad, TokensOutsideTheVocabularyAreRefused) {
  LlamaConfig config = tiny(Architecture::llama);
  MemoryModel weights = random_model(config, WeightType::f32, 2);
  ReferenceModel model = ReferenceModel::load(config, weights.source());
  ReferenceSequence seq(model);
  const std::int32_t bad = 50;
  EXPECT_THROW(seq.forward(std::span(&bad, 1)), std::out_of_range);
}

}  // namespace
}  // namespace mqlm::model
