// Models with random weights: the tiny preset loads in every weight type with llama.cpp's keys
// and tensor names, its numbers are small and finite, the same seed gives the same bytes,
// llama-quantize's mixtures are written as planned, and the 8B preset has the size it should
// without being written.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gguf/synthetic_model.hpp"
#include "model/gguf/synthetic_vocabulary.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "tests/model/gguf/gguf_test_files.hpp"

namespace mqlm::model::gguf {
namespace {

GgufFile load(const SyntheticModel& model) {
  return test::expect_file(GgufFile::parse(model.writer.to_bytes()));
}

// Mean and standard deviation of a tensor's values.
std::pair<double, double> moments(const GgufFile& file, const TensorInfo& t) {
  auto type = std::get<gpu::WeightType>(weight_type(t));
  auto values = gpu::dequantize(type, file.data(t), t.rows(), t.row_length());
  double sum = 0, squares = 0;
  for (float v : values) {
    EXPECT_TRUE(std::isfinite(v)) << t.name;
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  double mean = sum / static_cast<double>(values.size());
  return {mean, std::sqrt(squares / static_cast<double>(values.size()) - mean * mean)};
}

TEST(SyntheticModel, TinyLoadsInEveryType) {
  const ModelShape shape = *model_preset("tiny");
  for (auto type : gpu::all_weight_types) {
    SCOPED_TRACE(std::string(gpu::weight_type_name(type)));
    SyntheticModel model = make_synthetic_model(shape, type, 7, "tiny");
    EXPECT_TRUE(model.notes.empty());  // tiny's rows are whole Q4_K blocks
    GgufFile file = load(model);
    EXPECT_LT(file.file_size(), 10'000'000u);
    EXPECT_EQ(file.get_string("general.architecture"), "llama");
    EXPECT_EQ(file.get_uint("llama.block_count"), 2u);
    EXPECT_EQ(file.get_uint("llama.embedding_length"), 256u);
    EXPECT_EQ(file.get_uint("llama.feed_forward_length"), 768u);
    EXPECT_EQ(file.get_uint("llama.attention.head_count"), 4u);
    EXPECT_EQ(file.get_uint("llama.attention.head_count_kv"), 2u);
    EXPECT_EQ(file.find("llama.attention.key_length"), nullptr);  // 256 / 4 = 64 already
    EXPECT_EQ(file.get_float("llama.rope.freq_base"), 500000.0);
    EXPECT_NEAR(*file.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
    EXPECT_EQ(file.get_uint("llama.context_length"), 2048u);
    ASSERT_EQ(file.tensors().size(), 1 + 2 * 9 + 2u);
    for (const char* name : {"token_embd.weight", "blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight",
                             "blk.1.attn_output.weight", "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight",
                             "blk.1.ffn_down.weight", "output.weight"}) {
      ASSERT_NE(file.tensor(name), nullptr) << name;
      EXPECT_EQ(file.tensor(name)->type, to_tensor_type(type)) << name;
    }
    EXPECT_EQ(file.tensor("blk.0.attn_k.weight")->dims, (std::vector<std::uint64_t>{256, 128}));
    EXPECT_EQ(file.tensor("blk.0.ffn_down.weight")->dims, (std::vector<std::uint64_t>{768, 256}));
    EXPECT_EQ(file.tensor("token_embd.weight")->dims, (std::vector<std::uint64_t>{256, 1024}));
    for (const char* name : {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"}) {
      EXPECT_EQ(file.tensor(name)->type, TensorType::f32) << name;
    }
    auto [mean, std] = moments(file, *file.tensor("blk.0.ffn_up.weight"));
    EXPECT_NEAR(mean, 0.0, 0.002);
    EXPECT_NEAR(std, 0.02, 0.004);
    auto [norm_mean, norm_std] = moments(file, *file.tensor("output_norm.weight"));
    EXPECT_NEAR(norm_mean, 1.0, 0.01);
    EXPECT_LT(norm_std, 0.05);

    auto vocabulary = read_vocabulary(file);
    ASSERT_TRUE(std::holds_alternative<Vocabulary>(vocabulary)) << std::get<GgufError>(vocabulary).message();
    const Vocabulary& v = std::get<Vocabulary>(vocabulary);
    EXPECT_EQ(v.tokens.size(), 1024u);
    EXPECT_EQ(v.tokens, make_byte_bpe_vocabulary(1024).tokens);
    EXPECT_EQ(v.tokens[static_cast<std::size_t>(v.bos)], "<|begin_of_text|>");
  }
}

TEST(SyntheticModel, Architectures) {
  ModelShape shape = *model_preset("tiny");
  shape.arch = "qwen2";
  GgufFile qwen2 = load(make_synthetic_model(shape, gpu::WeightType::q8_0, 1, "q2"));
  EXPECT_EQ(qwen2.get_uint("qwen2.block_count"), 2u);
  EXPECT_EQ(qwen2.tensor("blk.0.attn_q.bias")->dims, (std::vector<std::uint64_t>{256}));
  EXPECT_EQ(qwen2.tensor("blk.1.attn_v.bias")->type, TensorType::f32);
  EXPECT_EQ(qwen2.tensor("blk.0.attn_q_norm.weight"), nullptr);

  shape.arch = "qwen3";
  shape.head_dim = 128;  // head dim != hidden / heads: the key lengths are said
  GgufFile qwen3 = load(make_synthetic_model(shape, gpu::WeightType::q8_0, 1, "q3"));
  EXPECT_EQ(qwen3.get_uint("qwen3.attention.key_length"), 128u);
  EXPECT_EQ(qwen3.get_uint("qwen3.attention.value_length"), 128u);
  EXPECT_EQ(qwen3.tensor("blk.1.attn_k_norm.weight")->dims, (std::vector<std::uint64_t>{128}));
  EXPECT_EQ(qwen3.tensor("blk.0.attn_q.weight")->dims, (std::vector<std::uint64_t>{256, 512}));
  EXPECT_EQ(qwen3.tensor("blk.0.attn_output.weight")->dims, (std::vector<std::uint64_t>{512, 256}));
  EXPECT_EQ(qwen3.tensor("blk.0.attn_q.bias"), nullptr);

  shape = *model_preset("tiny");
  shape.tied_embeddings = true;
  GgufFile tied = load(make_synthetic_model(shape, gpu::WeightType::f16, 1, "tied"));
  EXPECT_EQ(tied.tensor("output.weight"), nullptr);
}

TEST(SyntheticModel, SameSeedSameBytes) {
  const ModelShape shape = *model_preset("tiny");
  auto a = make_synthetic_model(shape, gpu::WeightType::q4_0, 5, "tiny").writer.to_bytes();
  auto b = make_synthetic_model(shape, gpu::WeightType::q4_0, 5, "tiny").writer.to_bytes();
  auto c = make_synthetic_model(shape, gpu::WeightType::q4_0, 6, "tiny").writer.to_bytes();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(SyntheticModel, TensorsOfASmallModelDoNotRepeat) {
  GgufFile file = load(make_synthetic_model(*model_preset("tiny"), gpu::WeightType::f16, 3, "tiny"));
  auto up = file.data(*file.tensor("blk.0.ffn_up.weight")), gate = file.data(*file.tensor("blk.0.ffn_gate.weight"));
  EXPECT_FALSE(std::equal(up.begin(), up.end(), gate.begin()));
}

TEST(SyntheticModel, PureFallsBackAsLlamaQuantizeDoes) {
  ModelShape shape = *model_preset("tiny");
  shape.hidden = 320;  // 5 heads of 64: rows of 320 are not whole Q4_K blocks of 256
  shape.heads = 5;
  shape.kv_heads = 1;
  SyntheticModel model = make_synthetic_model(shape, gpu::WeightType::q4_k, 1, "odd");
  ASSERT_FALSE(model.notes.empty());
  EXPECT_EQ(model.notes[0], "token_embd.weight is q5_0: rows of 320 elements are not whole q4_k blocks of 256");
  EXPECT_EQ(model.matrix_types.at("blk.0.attn_q.weight"), gpu::WeightType::q5_0);
  EXPECT_EQ(model.matrix_types.at("blk.0.ffn_down.weight"), gpu::WeightType::q4_k);  // rows of 768
  EXPECT_EQ(model.matrix_types.at("output.weight"), gpu::WeightType::q5_0);          // pure: no Q6_K output
}

// Q4_K_M of the tiny preset's 2 layers: Q6_K in the output and in the last layer's attn_v and
// ffn_down (the last eighth), Q4_K elsewhere; F32 norms.
TEST(SyntheticModel, TinyQ4KMMixture) {
  QuantMixture q4_k_m(FileType::q4_k_m, mixture_model(*model_preset("tiny")));
  SyntheticModel model = make_synthetic_model(*model_preset("tiny"), q4_k_m, 1, "tiny");
  EXPECT_TRUE(model.notes.empty());
  ASSERT_EQ(model.matrix_types.size(), 2 + 2 * 7u);
  for (const auto& [name, type] : model.matrix_types) {
    bool more_bits = name == "output.weight" || name == "blk.1.attn_v.weight" || name == "blk.1.ffn_down.weight";
    EXPECT_EQ(type, more_bits ? gpu::WeightType::q6_k : gpu::WeightType::q4_k) << name;
  }
}

// What make_synthetic_model plans is what it writes, with general.file_type llama.cpp's number.
TEST(SyntheticModel, MixturesWriteTheirTypes) {
  ModelShape shape = *model_preset("tiny");
  shape.tied_embeddings = true;
  for (FileType file_type : {FileType::q4_k_m, FileType::q3_k_l, FileType::iq4_xs, FileType::q4_0}) {
    SCOPED_TRACE(std::string(file_type_name(file_type)));
    SyntheticModel model = make_synthetic_model(shape, QuantMixture(file_type, mixture_model(shape)), 2, "tiny");
    GgufFile file = load(model);
    EXPECT_EQ(file.get_uint("general.file_type"), static_cast<std::uint32_t>(file_type));
    for (const auto& [name, type] : model.matrix_types) EXPECT_EQ(file.tensor(name)->type, to_tensor_type(type)) << name;
    EXPECT_EQ(model.matrix_types.at("token_embd.weight"), gpu::WeightType::q6_k);  // tied: the output's type
    auto [mean, std] = moments(file, *file.tensor("blk.1.attn_v.weight"));
    EXPECT_NEAR(std, 0.02, 0.004);
  }
}

TEST(SyntheticModel, Llama3_8bPlan) {
  const ModelShape shape = *model_preset("llama3-8b");
  EXPECT_EQ(shape.hidden, 4096u);
  EXPECT_EQ(shape.vocab, 128256u);
  SyntheticModel model = make_synthetic_model(shape, gpu::WeightType::q4_0, 1, "llama3-8b");
  EXPECT_TRUE(model.notes.empty());
  // 8.03e9 parameters, of which 266k are F32 norms; Q4_0 is 18 bytes per 32.
  std::uint64_t matrices = 2ull * 4096 * 128256 + 32ull * (4096ull * 4096 * 2 + 4096ull * 1024 * 2 + 3ull * 4096 * 14336);
  std::uint64_t expected = matrices / 32 * 18 + (65ull * 4096) * 4;
  EXPECT_GT(model.writer.file_size(), expected);
  EXPECT_LT(model.writer.file_size(), expected + 8'000'000);  // metadata (the vocabulary) and padding
}

// qwen35: the tiny preset's layers 3 and 7 attend (a q projection twice as wide: q and its gate),
// the others are Gated DeltaNet layers, with llama.cpp's names, the ssm.* keys and M-RoPE sections;
// the convolution's taps, decays and the other vectors in F32, the decays negative. qwen35-9b has
// Qwen3.5-9B's 8.95e9 parameters.
TEST(SyntheticModel, Qwen35Hybrid) {
  const GgufFile file = load(make_synthetic_model(*model_preset("tiny-qwen35"), gpu::WeightType::f16, 1, "h"));
  EXPECT_EQ(file.get_uint("qwen35.ssm.inner_size"), 256u);
  EXPECT_EQ(file.get_uint("qwen35.full_attention_interval"), 4u);
  ASSERT_NE(file.get_array<std::int32_t>("qwen35.rope.dimension_sections"), nullptr);
  EXPECT_EQ(*file.get_array<std::int32_t>("qwen35.rope.dimension_sections"), (std::vector<std::int32_t>{3, 3, 2, 0}));
  for (std::uint32_t l = 0; l < 8; ++l) {
    const bool attends = l % 4 == 3;
    auto name = [l](const char* what) { return "blk." + std::to_string(l) + "." + what; };
    EXPECT_EQ(file.tensor(name("attn_q.weight")) != nullptr, attends) << l;
    EXPECT_EQ(file.tensor(name("attn_qkv.weight")) != nullptr, !attends) << l;
    ASSERT_NE(file.tensor(name("post_attention_norm.weight")), nullptr) << l;
    if (attends) {
      EXPECT_EQ(file.tensor(name("attn_q.weight"))->dims, (std::vector<std::uint64_t>{256, 512}));
      continue;
    }
    EXPECT_EQ(file.tensor(name("attn_qkv.weight"))->dims, (std::vector<std::uint64_t>{256, 512}));  // q, k 128; v 256
    EXPECT_EQ(file.tensor(name("ssm_conv1d.weight"))->dims, (std::vector<std::uint64_t>{4, 512}));
    EXPECT_EQ(file.tensor(name("ssm_conv1d.weight"))->type, TensorType::f32);
    EXPECT_EQ(file.tensor(name("ssm_out.weight"))->dims, (std::vector<std::uint64_t>{256, 256}));
    const TensorInfo& decays = *file.tensor(name("ssm_a"));
    for (float v : gpu::dequantize(gpu::WeightType::f32, file.data(decays), 1, decays.row_length())) EXPECT_LT(v, 0.0f);
  }
  const ModelShape nine = *model_preset("qwen35-9b");
  std::uint64_t per_layer_ffn = 3ull * 4096 * 12288, delta_net = 4096ull * (8192 + 4096 + 64 + 4096);
  std::uint64_t attention = 4096ull * (8192 + 2048 + 4096), embeddings = 2ull * 4096 * nine.vocab;
  std::uint64_t matrices = embeddings + 32 * per_layer_ffn + 24 * delta_net + 8 * attention;
  EXPECT_NEAR(static_cast<double>(matrices), 8.95e9, 0.01e9);
  SyntheticModel model = make_synthetic_model(nine, gpu::WeightType::q8_0, 1, "qwen35-9b");
  EXPECT_GT(model.writer.file_size(), matrices / 32 * 34);
  EXPECT_LT(model.writer.file_size(), matrices / 32 * 34 + 16'000'000);  // F32 vectors, the vocabulary, padding
}

TEST(SyntheticModel, ShapeProblems) {
  ModelShape shape = *model_preset("tiny");
  EXPECT_EQ(shape_problem(shape), std::nullopt);
  shape.kv_heads = 3;
  EXPECT_EQ(shape_problem(shape), "4 heads do not share 3 KV heads evenly");
  shape = *model_preset("tiny");
  shape.vocab = 100;
  EXPECT_NE(shape_problem(shape)->find("vocab must be between 261"), std::string::npos);
  shape = *model_preset("tiny");
  shape.arch = "gpt2";
  EXPECT_NE(shape_problem(shape)->find("unknown architecture 'gpt2'"), std::string::npos);
  shape = *model_preset("tiny");
  shape.layers = 0;
  EXPECT_NE(shape_problem(shape)->find("layers must be between 1"), std::string::npos);
  EXPECT_EQ(model_preset("huge"), std::nullopt);
  for (std::string_view name : model_preset_names()) EXPECT_EQ(shape_problem(*model_preset(name)), std::nullopt) << name;
  shape = *model_preset("tiny");
  shape.rope_scaling.type = RopeScalingType::longrope;
  EXPECT_NE(shape_problem(shape)->find("longrope scaling is Phi-3's"), std::string::npos);
}

// Phi-3's LongRoPE as convert_hf_to_gguf writes it: both factor tensors, the original context and
// the attention factor its stretch gives (sqrt(1 + ln 32 / ln 4096) for phi3-mini-128k), no type.
TEST(SyntheticModel, Phi3LongRope) {
  ModelShape shape = *model_preset("phi3-mini-128k");
  EXPECT_EQ(shape.context, 131072u);
  EXPECT_EQ(shape.rope_scaling.type, RopeScalingType::longrope);
  shape = *model_preset("tiny");
  shape.arch = "phi3";
  shape.context = 131072;
  shape.rope_scaling = {.type = RopeScalingType::longrope, .original_context = 4096};
  GgufFile file = load(make_synthetic_model(shape, gpu::WeightType::f16, 3, "phi3"));
  for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    const TensorInfo* t = file.tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->elements(), 32u);
  }
  EXPECT_EQ(file.get_uint("phi3.rope.scaling.original_context_length"), 4096u);
  EXPECT_NEAR(*file.get_float("phi3.rope.scaling.attn_factor"), std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-6);
  EXPECT_EQ(file.find("phi3.rope.scaling.type"), nullptr);
}

}  // namespace
}  // namespace mqlm::model::gguf
