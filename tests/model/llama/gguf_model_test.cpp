// The whole loading path: a model written as GGUF by make-model's generator, parsed, its
// configuration read from the metadata, its tensors handed to both forward passes; the GPU's
// logits then match the CPU reference's (bound as in gpu_model_test.cpp).
#include <gtest/gtest.h>

#include <cmath>

#include "model/gguf/synthetic_model.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace mqlm::model {
namespace {

class GgufModelTest : public ::testing::TestWithParam<std::tuple<std::string, gpu::WeightType>> {};

TEST_P(GgufModelTest, LoadsAndBothForwardPassesAgree) {
  auto [arch, type] = GetParam();
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  shape.arch = arch;
  auto bytes = gguf::make_synthetic_model(shape, type, 5, "tiny").writer.to_bytes();
  auto parsed = gguf::GgufFile::parse(std::move(bytes));
  ASSERT_TRUE(std::holds_alternative<gguf::GgufFile>(parsed)) << std::get<gguf::GgufError>(parsed).message();
  const auto& file = std::get<gguf::GgufFile>(parsed);
  auto config_or = read_llama_config(file);
  ASSERT_TRUE(std::holds_alternative<LlamaConfig>(config_or)) << std::get<std::string>(config_or);
  LlamaConfig config = std::get<LlamaConfig>(config_or);
  EXPECT_EQ(architecture_name(config.arch), arch);
  EXPECT_EQ(config.n_layers, shape.layers);
  EXPECT_EQ(config.n_embd, shape.hidden);
  EXPECT_EQ(config.head_dim, shape.head_dim);

  ReferenceModel reference = ReferenceModel::load(config, gguf_tensor_source(file));
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  GpuModel model(ctx, config, gguf_tensor_source(file), "weights:gguf-test");
  GpuKvCache cache(ctx, config, 4, 16);

  // More tokens than the mat-vec path takes: the tiled matmuls and the separate norm run too.
  const std::vector<std::int32_t> prompt{1, 50, 300, 7, 1000, 2, 5, 6, 7, 8, 9, 10};
  StepBatch batch;
  batch.block_tables = {{2, 0, 3, 1}};
  for (std::uint32_t i = 0; i < prompt.size(); ++i) batch.tokens.push_back({0, i, prompt[i], true});
  auto gpu_logits = model.forward(batch, cache);
  ReferenceSequence seq(reference);
  auto ref_logits = seq.forward(prompt);
  ASSERT_EQ(gpu_logits.size(), ref_logits.size());
  double worst = 0, scale = 1e-6;
  for (std::size_t i = 0; i < ref_logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu_logits[i]));
    worst = std::max(worst, std::abs(double(gpu_logits[i]) - ref_logits[i]));
    scale = std::max(scale, std::abs(double(ref_logits[i])));
  }
  EXPECT_LT(worst / scale, 2e-2);
}

INSTANTIATE_TEST_SUITE_P(ArchitecturesAndTypes, GgufModelTest,
                         ::testing::Combine(::testing::Values("llama", "qwen2", "qwen3"),
                                            ::testing::Values(gpu::WeightType::f16, gpu::WeightType::q4_0,
                                                              gpu::WeightType::q4_k)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(gpu::weight_type_name(std::get<1>(info.param)));
                         });

TEST(GgufModelConfig, UnsupportedArchitectureIsNamed) {
  gguf::GgufWriter writer;
  writer.set("general.architecture", std::string("mamba"));
  auto parsed = gguf::GgufFile::parse(writer.to_bytes());
  ASSERT_TRUE(std::holds_alternative<gguf::GgufFile>(parsed));
  auto config = read_llama_config(std::get<gguf::GgufFile>(parsed));
  ASSERT_TRUE(std::holds_alternative<std::string>(config));
  EXPECT_NE(std::get<std::string>(config).find("'mamba' is not supported"), std::string::npos);
}

// Loads a file the way the executor does (configuration, then the GpuModel); says what stopped it.
std::string load_as_the_executor_does(const gguf::GgufFile& file, GpuContext ctx) {
  auto config = read_llama_config(file);
  if (auto* why = std::get_if<std::string>(&config)) return *why;
  try {
    GpuModel model(ctx, std::get<LlamaConfig>(config), gguf_tensor_source(file), "weights:refused");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "loaded";
}

// A tensor of a type mqlm does not compute with is refused when the configuration is read, before
// the pool gives out a byte; the message names the tensor, its type and every type mqlm computes
// with. (Uploading tensors until the lookup of the bad one threw would have taken some.)
TEST(GgufModelConfig, TensorOfATypeMqlmDoesNotComputeWithIsRefusedBeforeUpload) {
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  shape.tied_embeddings = true;  // the file's output.weight is the one below
  auto model = gguf::make_synthetic_model(shape, gpu::WeightType::f16, 5, "tiny");
  const auto* iq2_xxs = gguf::tensor_type_traits(static_cast<std::uint32_t>(gguf::TensorType::iq2_xxs));
  const std::uint64_t blocks = std::uint64_t{shape.hidden} * shape.vocab / iq2_xxs->block_elements;
  model.writer.add_tensor("output.weight", gguf::TensorType::iq2_xxs, {shape.hidden, shape.vocab},
                          std::vector<std::byte>(blocks * iq2_xxs->block_bytes));
  auto parsed = gguf::GgufFile::parse(model.writer.to_bytes());
  ASSERT_TRUE(std::holds_alternative<gguf::GgufFile>(parsed)) << std::get<gguf::GgufError>(parsed).message();
  auto& g = gpu::testing::shared_gpu();
  g.pool.reset_peak();
  const std::uint64_t active_before = g.pool.stats().active_bytes;

  const std::string why = load_as_the_executor_does(std::get<gguf::GgufFile>(parsed), {g.queue, g.pool, g.kernels});
  EXPECT_NE(why.find("tensor 'output.weight' has type IQ2_XXS, which mqlm does not compute with"), std::string::npos)
      << why;
  for (gpu::WeightType type : gpu::all_weight_types) {
    EXPECT_NE(why.find(gguf::tensor_type_name(gguf::to_tensor_type(type))), std::string::npos) << why;
  }
  EXPECT_EQ(g.pool.stats().peak_active_bytes, active_before);
}

}  // namespace
}  // namespace mqlm::model
