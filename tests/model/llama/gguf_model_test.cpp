// The whole loading path: a model written as GGUF by make-model's generator, parsed, its
// configuration read from the metadata, its tensors handed to both forward passes; the GPU's
// logits then match the CPU reference's (bound as in gpu_model_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "model/gguf/rope_scaling.hpp"
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
  shape.arch = arch == "mixtral" ? "llama" : arch;  // Mixtral: llama with experts
  if (arch == "mixtral" || arch == "qwen3moe") {
    shape.experts = 8;
    shape.experts_used = 2;
    shape.expert_ffn = arch == "qwen3moe" ? 256 : 0;
  }
  auto bytes = gguf::make_synthetic_model(shape, type, 5, "tiny").writer.to_bytes();
  auto parsed = gguf::GgufFile::parse(std::move(bytes));
  ASSERT_TRUE(std::holds_alternative<gguf::GgufFile>(parsed)) << std::get<gguf::GgufError>(parsed).message();
  const auto& file = std::get<gguf::GgufFile>(parsed);
  auto config_or = read_llama_config(file);
  ASSERT_TRUE(std::holds_alternative<LlamaConfig>(config_or)) << std::get<std::string>(config_or);
  LlamaConfig config = std::get<LlamaConfig>(config_or);
  EXPECT_EQ(architecture_name(config.arch), shape.arch);
  EXPECT_EQ(config.n_expert, shape.experts);
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
                         ::testing::Combine(::testing::Values("llama", "qwen2", "qwen3", "phi3", "qwen3moe", "mixtral"),
                                            ::testing::Values(gpu::WeightType::f16, gpu::WeightType::q4_0,
                                                              gpu::WeightType::q4_k)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(gpu::weight_type_name(std::get<1>(info.param)));
                         });

// A tiny make-model file of `arch` (a sliding window of `window` where non-zero), its configuration.
LlamaConfig tiny_config(const std::string& arch, std::uint32_t window, std::uint32_t layers = 2) {
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  shape.arch = arch;
  shape.layers = layers;
  shape.sliding_window = window;
  auto parsed = gguf::GgufFile::parse(gguf::make_synthetic_model(shape, gpu::WeightType::f32, 5, "t").writer.to_bytes());
  auto config = read_llama_config(std::get<gguf::GgufFile>(parsed));
  if (auto* why = std::get_if<std::string>(&config)) throw std::runtime_error(*why);
  return std::get<LlamaConfig>(config);
}

// Gemma's keys and defaults as llama.cpp's gemma2.cpp and gemma3.cpp read them.
TEST(GgufModelConfig, GemmaWindowsCapsAndLocalRope) {
  const LlamaConfig gemma2 = tiny_config("gemma2", 16);
  EXPECT_EQ(gemma2.sliding_window, 16u);
  EXPECT_TRUE(gemma2.local_layer(0));  // every other layer, from the first
  EXPECT_FALSE(gemma2.local_layer(1));
  EXPECT_EQ(gemma2.window(0), 16u);
  EXPECT_EQ(gemma2.window(1), 0u);
  EXPECT_FLOAT_EQ(gemma2.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(gemma2.final_softcap, 30.0f);
  EXPECT_FLOAT_EQ(gemma2.query_scale(), 0.125f);  // 1 / sqrt(head_dim 64)
  EXPECT_FLOAT_EQ(gemma2.rope_base_local, gemma2.rope_base);
  EXPECT_TRUE(gemma2.tied_output && gemma2.post_norms() && gemma2.gelu() && gemma2.scaled_embedding());
  EXPECT_EQ(tiny_config("gemma2", 0).sliding_window, 4096u);  // Gemma 2's, where the file names none

  const LlamaConfig gemma3 = tiny_config("gemma3", 16, 7);
  for (std::uint32_t l = 0; l < 7; ++l) EXPECT_EQ(gemma3.local_layer(l), l != 5) << "layer " << l;  // five of six
  EXPECT_FLOAT_EQ(gemma3.rope_base_local, 10000.0f);
  EXPECT_FLOAT_EQ(gemma3.attn_softcap, 0.0f);
  EXPECT_FLOAT_EQ(gemma3.final_softcap, 0.0f);
  EXPECT_TRUE(gemma3.qk_norm());
  const LlamaConfig global_only = tiny_config("gemma3", 0);
  EXPECT_FALSE(global_only.local_layer(0) || global_only.local_layer(1));
}

// The experts' keys as llama.cpp reads them: qwen3moe's expert_feed_forward_length, Mixtral's
// experts as wide as feed_forward_length; a file using more experts than it has is refused.
TEST(GgufModelConfig, ExpertsKeys) {
  auto config_of = [](const gguf::ModelShape& shape) {
    auto parsed = gguf::GgufFile::parse(gguf::make_synthetic_model(shape, gpu::WeightType::f32, 5, "t").writer.to_bytes());
    return read_llama_config(std::get<gguf::GgufFile>(parsed));
  };
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  shape.arch = "qwen3moe";
  shape.experts = 8;
  shape.experts_used = 2;
  shape.expert_ffn = 128;
  const LlamaConfig qwen = std::get<LlamaConfig>(config_of(shape));
  EXPECT_TRUE(qwen.moe() && qwen.qk_norm() && qwen.rope_neox());
  EXPECT_EQ(qwen.n_expert, 8u);
  EXPECT_EQ(qwen.n_expert_used, 2u);
  EXPECT_EQ(qwen.n_ff_exp, 128u);
  shape.arch = "llama";
  shape.expert_ffn = 0;
  const LlamaConfig mixtral = std::get<LlamaConfig>(config_of(shape));
  EXPECT_EQ(mixtral.arch, Architecture::llama);
  EXPECT_EQ(mixtral.n_ff_exp, shape.ffn);
  EXPECT_FALSE(mixtral.qk_norm());
  shape.experts_used = 3;
  auto model = gguf::make_synthetic_model(shape, gpu::WeightType::f32, 5, "t");
  model.writer.set("llama.expert_used_count", std::uint32_t{9});
  auto parsed = gguf::GgufFile::parse(model.writer.to_bytes());
  auto refused = read_llama_config(std::get<gguf::GgufFile>(parsed));
  ASSERT_TRUE(std::holds_alternative<std::string>(refused));
  EXPECT_NE(std::get<std::string>(refused).find("expert_used_count"), std::string::npos) << std::get<std::string>(refused);
}

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

// The configuration of a make-model file of `shape` (with `extra` applied to its writer), or what
// stopped it.
std::variant<LlamaConfig, std::string> config_of(const gguf::ModelShape& shape,
                                                 const std::function<void(gguf::GgufWriter&)>& extra = {}) {
  auto model = gguf::make_synthetic_model(shape, gpu::WeightType::f16, 5, "rope");
  if (extra) extra(model.writer);
  auto parsed = gguf::GgufFile::parse(model.writer.to_bytes());
  if (auto* error = std::get_if<gguf::GgufError>(&parsed)) return error->message();
  return read_llama_config(std::get<gguf::GgufFile>(parsed));
}

LlamaConfig expect_config(const gguf::ModelShape& shape) {
  auto config = config_of(shape);
  if (auto* why = std::get_if<std::string>(&config)) ADD_FAILURE() << *why;
  return std::holds_alternative<LlamaConfig>(config) ? std::get<LlamaConfig>(config) : LlamaConfig{};
}

// Each scaling make-model writes reads back as llama.cpp would apply it: linear and YaRN divide
// positions by the factor; YaRN's ramp is on, from the original context, and its attention factor
// is rope.scaling.attn_factor (llama.cpp's own factor is 1 past a factor of 1); llama3 gives each
// pair its factor whether the file carries them as rope_freqs.weight or as keys; partial rotary
// dims come from rope.dimension_count.
TEST(GgufRopeScaling, ReadsBackWhatMakeModelWrites) {
  using Type = gguf::RopeScalingType;
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  shape.context = 4096;
  LlamaConfig plain = expect_config(shape);
  EXPECT_EQ(plain.rope_scale, 1.0f);
  EXPECT_EQ(plain.yarn_ext_factor, 0.0f);
  EXPECT_TRUE(plain.rope_freq_factors.empty());
  EXPECT_EQ(plain.rotary_dims(), 64u);

  shape.rope_scaling = {.type = Type::linear, .factor = 4.0f};
  EXPECT_EQ(expect_config(shape).rope_scale, 4.0f);

  shape.rope_scaling = {.type = Type::yarn, .factor = 8.0f, .original_context = 512, .attn_factor = 0.8f};
  LlamaConfig yarn = expect_config(shape);
  EXPECT_EQ(yarn.rope_scale, 8.0f);
  EXPECT_EQ(yarn.yarn_ext_factor, 1.0f);
  EXPECT_NEAR(yarn.yarn_attn_factor, 0.8f, 1e-6f);
  EXPECT_EQ(yarn.yarn_original_context, 512u);
  EXPECT_EQ(yarn.yarn_beta_fast, 32.0f);
  EXPECT_EQ(yarn.yarn_beta_slow, 1.0f);

  shape.rope_scaling = {.type = Type::llama3, .factor = 8.0f, .original_context = 256};
  const auto want = gguf::llama3_rope_factors(shape.rope_scaling, shape.rope_base, 64);
  ASSERT_EQ(want.size(), 32u);
  EXPECT_EQ(want.front(), 1.0f);  // the fastest pair keeps its frequency
  EXPECT_EQ(want.back(), 8.0f);   // the slowest is divided by the factor
  for (bool tensor : {true, false}) {
    shape.rope_freqs_tensor = tensor;
    LlamaConfig llama3 = expect_config(shape);
    EXPECT_EQ(llama3.rope_freq_factors, want) << (tensor ? "rope_freqs.weight" : "keys");
    EXPECT_EQ(llama3.rope_scale, 1.0f);
  }

  shape.rope_scaling = {};
  shape.rotary_dims = 32;
  EXPECT_EQ(expect_config(shape).rotary_dims(), 32u);
}

// Phi-3's LongRoPE as llama.cpp applies it: the long factors where the context is past the original
// one, the short ones where not, and cos and sin scaled by rope.scaling.attn_factor (which make-model,
// as convert_hf_to_gguf, derives from the stretch: sqrt(1 + ln 8 / ln 512) for 4096 from 512).
TEST(GgufRopeScaling, LongRopeFactorsByTheContext) {
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  shape.arch = "phi3";
  shape.context = 4096;
  shape.rope_scaling = {.type = gguf::RopeScalingType::longrope, .original_context = 512};
  const LlamaConfig stretched = expect_config(shape);
  EXPECT_EQ(stretched.rope_freq_factors, gguf::longrope_factors(8.0f, 64, true));
  EXPECT_NEAR(stretched.yarn_attn_factor, std::sqrt(1.0f + std::log(8.0f) / std::log(512.0f)), 1e-6f);
  EXPECT_EQ(stretched.rope_scale, 1.0f);
  EXPECT_EQ(stretched.yarn_ext_factor, 0.0f);
  EXPECT_NE(gguf::longrope_factors(8.0f, 64, true), gguf::longrope_factors(8.0f, 64, false));

  shape.rope_scaling.original_context = 4096;  // not past it: the short factors, unscaled
  const LlamaConfig unstretched = expect_config(shape);
  EXPECT_EQ(unstretched.rope_freq_factors, gguf::longrope_factors(1.0f, 64, false));
  EXPECT_EQ(unstretched.yarn_attn_factor, 1.0f);

  shape.rope_scaling = {.type = gguf::RopeScalingType::longrope, .original_context = 512, .attn_factor = 0.9f};
  EXPECT_NEAR(expect_config(shape).yarn_attn_factor, 0.9f, 1e-6f);  // the file's own
}

// What mqlm cannot honour is refused with the reason, not run wrong: another scaling type, a
// rope_freqs.weight of the wrong length, rotary dims past the head.
TEST(GgufRopeScaling, RefusesWhatItCannotHonour) {
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  auto why = [&](const std::function<void(gguf::GgufWriter&)>& extra) {
    auto config = config_of(shape, extra);
    return std::holds_alternative<std::string>(config) ? std::get<std::string>(config) : std::string("loaded");
  };
  EXPECT_NE(why([](gguf::GgufWriter& w) { w.set("llama.rope.scaling.type", std::string("su")); })
                .find("rope scaling 'su' is not supported"),
            std::string::npos);
  shape.arch = "phi3";
  EXPECT_NE(why([](gguf::GgufWriter& w) {
              w.add_tensor("rope_factors_long.weight", gguf::TensorType::f32, {16}, std::vector<std::byte>(64));
              w.set("phi3.rope.scaling.original_context_length", std::uint32_t{512});
            }).find("rope_factors_long.weight must be F32 with 32 elements"),
            std::string::npos);
  shape.arch = "llama";
  EXPECT_NE(why([](gguf::GgufWriter& w) {
              w.add_tensor("rope_freqs.weight", gguf::TensorType::f32, {16}, std::vector<std::byte>(64));
            }).find("rope_freqs.weight must be F32 with 32 elements"),
            std::string::npos);
  EXPECT_NE(why([](gguf::GgufWriter& w) { w.set("llama.rope.dimension_count", std::uint32_t{128}); })
                .find("rope.dimension_count"),
            std::string::npos);
}

// Issue 33's case: a rope_freqs.weight of factors 1000 used to give the logits of none. Now it
// turns the slow pairs all but still: the GPU agrees with the reference, and not with the file
// without the tensor.
TEST(GgufRopeScaling, RopeFreqsTensorChangesTheLogits) {
  gguf::ModelShape shape = *gguf::model_preset("tiny");
  auto& g = gpu::testing::shared_gpu();
  GpuContext ctx{g.queue, g.pool, g.kernels};
  auto logits = [&](bool with_factors, bool reference) {
    auto model = gguf::make_synthetic_model(shape, gpu::WeightType::f16, 5, "rope");
    if (with_factors) {
      const std::vector<float> factors(32, 1000.0f);
      model.writer.add_tensor("rope_freqs.weight", gguf::TensorType::f32, {32},
                              std::vector<std::byte>(reinterpret_cast<const std::byte*>(factors.data()),
                                                     reinterpret_cast<const std::byte*>(factors.data() + 32)));
    }
    auto file = std::get<gguf::GgufFile>(gguf::GgufFile::parse(model.writer.to_bytes()));
    const LlamaConfig config = std::get<LlamaConfig>(read_llama_config(file));
    std::vector<std::int32_t> prompt(64);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 31 + 7) % 1000);
    if (reference) {
      ReferenceModel ref = ReferenceModel::load(config, gguf_tensor_source(file));
      ReferenceSequence seq(ref);
      auto all = seq.forward(prompt);
      return std::vector<float>(all.end() - config.n_vocab, all.end());
    }
    GpuModel model_gpu(ctx, config, gguf_tensor_source(file), "weights:rope-freqs");
    GpuKvCache cache(ctx, config, 4, 16);
    StepBatch batch;
    batch.block_tables = {{2, 0, 3, 1}};
    for (std::uint32_t i = 0; i < prompt.size(); ++i) batch.tokens.push_back({0, i, prompt[i], i + 1 == prompt.size()});
    return model_gpu.forward(batch, cache);
  };
  auto error = [](const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0, scale = 1e-6;
    for (std::size_t i = 0; i < b.size(); ++i) {
      worst = std::max(worst, std::abs(double(a[i]) - b[i]));
      scale = std::max(scale, std::abs(double(b[i])));
    }
    return worst / scale;
  };
  const auto scaled = logits(true, false);
  const double against_reference = error(scaled, logits(true, true)), against_none = error(scaled, logits(false, false));
  EXPECT_LT(against_reference, 2e-2);
  EXPECT_GT(against_none, 4 * against_reference) << against_none;
}

}  // namespace
}  // namespace mqlm::model
