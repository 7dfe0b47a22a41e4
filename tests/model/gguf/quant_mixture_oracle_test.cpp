// llama-quantize's mixtures, asked of llama.cpp itself: an F16 model written by mqlm's synthetic
// writer is quantized by llama_model_quantize to every file type mqlm names, and each tensor of
// what it writes has the type QuantMixture gives it in make-model's plan for that file type
// (matrices) or stays F32 (norms, biases).
// The shapes bring out each part of the rule: the layer positions (16 and 32 layers), 4 heads
// per KV head, tied embeddings, qwen2's biases, rows that are not whole K-quant blocks or not
// even whole blocks of 32, and the 70B rule (80 layers, kept tiny). And make-model's own mixture
// files load in llama.cpp.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unistd.h>

#include <fmt/format.h>
#include <ggml-backend.h>
#include <llama.h>

#include "model/gguf/quant_mixture.hpp"
#include "model/gguf/synthetic_model.hpp"
#include "tests/model/gguf/gguf_test_files.hpp"
#include "tests/oracle/llamacpp.hpp"

namespace mqlm::model::gguf {
namespace {

namespace fs = std::filesystem;

class QuantMixtureOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { mqlm::testing::start_llamacpp(); }

  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = fs::temp_directory_path() / fmt::format("mqlm-mixture-{}-{}", ::getpid(), test->name());
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  // Writes the shape's F16 model, has llama.cpp quantize it to each file type and compares.
  void expect_same_types(const ModelShape& shape, std::span<const FileType> file_types) {
    const fs::path f16 = directory_ / "made-by-mqlm.gguf";
    auto error = make_synthetic_model(shape, gpu::WeightType::f16, 1, "oracle").writer.write(f16);
    ASSERT_FALSE(error) << error->detail;
    for (FileType file_type : file_types) {
      SCOPED_TRACE(std::string(file_type_name(file_type)));
      const fs::path out = directory_ / fmt::format("{}.gguf", file_type_name(file_type));
      ASSERT_NO_THROW(mqlm::testing::quantize_with_llamacpp(f16, out, static_cast<llama_ftype>(file_type), false, 2));
      // What make-model would write for this file type: its plan (pools are quantized only when
      // written, so the plan needs no quantizer).
      SyntheticModel ours = make_synthetic_model(shape, QuantMixture(file_type, mixture_model(shape)), 1, "oracle");
      expect_types(test::expect_file(GgufFile::open(out)), file_type, ours.matrix_types);
      fs::remove(out);
    }
  }

  static void expect_types(const GgufFile& file, FileType file_type,
                           const std::map<std::string, gpu::WeightType>& matrix_types) {
    EXPECT_EQ(file.get_uint("general.file_type"), static_cast<std::uint32_t>(file_type));
    std::size_t matrices = 0;
    for (const TensorInfo& t : file.tensors()) {
      auto ours = matrix_types.find(t.name);
      matrices += ours != matrix_types.end();
      TensorType expected = ours != matrix_types.end() ? to_tensor_type(ours->second) : TensorType::f32;
      EXPECT_EQ(tensor_type_name(t.type), tensor_type_name(expected)) << t.name << ", rows of " << t.row_length();
    }
    EXPECT_EQ(matrices, matrix_types.size());
  }

  fs::path directory_;
};

// Small dims for many layers: rows of 64 (hidden) take the fallbacks, which still tell every
// choice apart (Q6_K -> Q8_0, Q5_K -> Q5_1, Q4_K -> Q5_0); ffn_down's rows of 256 take none.
// 4 heads of 16 share one KV head.
ModelShape narrow_llama(std::uint32_t layers) {
  return ModelShape{.layers = layers, .hidden = 64, .heads = 4, .kv_heads = 1, .head_dim = 16, .ffn = 256, .vocab = 261};
}

// The smallest shape with every row whole K-quant blocks: hidden and FFN 256, 4 heads of 64.
ModelShape small_llama(std::uint32_t layers) {
  return ModelShape{.layers = layers, .hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 64, .ffn = 256, .vocab = 261};
}

// The file types people download most.
constexpr FileType kCommon[] = {FileType::q4_0, FileType::q8_0, FileType::q4_k_m, FileType::q5_k_m, FileType::q6_k};

TEST_F(QuantMixtureOracle, TinyPreset) { expect_same_types(*model_preset("tiny"), kCommon); }

// 16 layers: the first and last eighth, every third layer between, the first 1/16; and 32, as
// Llama 3 8B has.
TEST_F(QuantMixtureOracle, LayerPositionsWithFourHeadsPerKvHead) {
  expect_same_types(narrow_llama(16), all_file_types);
  expect_same_types(narrow_llama(32), std::array{FileType::q3_k_m, FileType::q4_k_m});
}

TEST_F(QuantMixtureOracle, Qwen2WithBiasesAndTiedEmbeddings) {
  ModelShape shape = small_llama(2);
  shape.arch = "qwen2";
  shape.tied_embeddings = true;
  expect_same_types(shape, all_file_types);
}

// Qwen3 with q/k norms and rows of 320 (hidden: 5 heads of 64) and 160 (FFN): whole blocks of
// 32 but not of 256, so every K-quant and IQ4_XS falls back.
TEST_F(QuantMixtureOracle, RowsNotWholeKQuantBlocks) {
  ModelShape shape = small_llama(2);
  shape.arch = "qwen3";
  shape.hidden = 320;
  shape.heads = 5;
  shape.kv_heads = 1;
  shape.ffn = 160;
  expect_same_types(shape, all_file_types);
  shape.tied_embeddings = true;
  expect_same_types(shape, std::array{FileType::q4_0, FileType::q4_k_m, FileType::q8_0, FileType::iq4_nl});
}

// Rows of 336 (6 heads of 56) and 200 are not whole blocks of 32 either: F16 where even the
// fallback does not fit.
TEST_F(QuantMixtureOracle, RowsNotWholeBlocksOf32) {
  ModelShape shape = small_llama(2);
  shape.hidden = 336;
  shape.heads = 6;
  shape.head_dim = 56;
  shape.ffn = 200;
  expect_same_types(shape, all_file_types);
}

// phi3's fused attn_qkv (llama.cpp takes it for an attn_v) and ffn_up of twice the rows, gemma2's
// and gemma3's extra norms (F32) and their output from the embedding.
TEST_F(QuantMixtureOracle, Phi3AndGemma) {
  for (const char* arch : {"phi3", "gemma2", "gemma3"}) {
    SCOPED_TRACE(arch);
    ModelShape shape = small_llama(2);
    shape.arch = arch;
    shape.vocab = 265;  // phi3's own specials too
    shape.tied_embeddings = std::string_view(arch) != "phi3";
    expect_same_types(shape, all_file_types);
  }
}

// A mixture of experts: ffn_*_exps (3-D) take ffn_down's and the default's types, the routers
// (ffn_gate_inp) stay F32; with exactly 8 experts attn_k and attn_v are Q8_0 and attn_output Q5_K in
// the lower mixtures (llama.cpp's rule for Mixtral), with 4 or 16 not.
TEST_F(QuantMixtureOracle, MixtureOfExperts) {
  for (std::uint32_t experts : {8u, 4u, 16u}) {
    SCOPED_TRACE(fmt::format("{} experts", experts));
    ModelShape shape = small_llama(2);
    shape.arch = "qwen3moe";
    shape.experts = experts;
    shape.experts_used = 2;
    shape.expert_ffn = 256;
    expect_same_types(shape, experts == 8 ? std::span<const FileType>(all_file_types) : std::span<const FileType>(kCommon));
  }
  ModelShape mixtral = narrow_llama(16);  // llama with experts; rows of 64 take the fallbacks
  mixtral.experts = 8;
  mixtral.experts_used = 2;
  expect_same_types(mixtral, all_file_types);
}

// 80 layers with grouped KV heads: llama.cpp takes the model for a 70B and gives attn_v Q5_K
// where it would have had Q3_K or Q4_K.
TEST_F(QuantMixtureOracle, SeventyBillionRule) {
  ModelShape shape = narrow_llama(80);
  shape.ffn = 64;
  expect_same_types(shape, std::array{FileType::q2_k, FileType::q3_k_s, FileType::q3_k_m, FileType::q4_k_s});
  shape.kv_heads = shape.heads;  // a llama of 80 layers without grouped KV heads is a 65B: no bump
  expect_same_types(shape, std::array{FileType::q3_k_s});
  shape.arch = "qwen2";  // qwen2 is 70B at 80 layers, grouped or not
  expect_same_types(shape, std::array{FileType::q3_k_s});
}

// make-model's own mixture files (a tied qwen2, so token_embd takes the output's type) load in
// llama.cpp, whose loader checks every tensor's size against its type and shape.
TEST_F(QuantMixtureOracle, MakeModelMixturesLoadInLlamaCpp) {
  ModelShape shape = small_llama(2);
  shape.arch = "qwen2";
  shape.tied_embeddings = true;
  shape.vocab = 512;  // llama.cpp wants BPE merges, which 261 tokens (bytes and specials) have none of
  for (FileType file_type : {FileType::q4_k_m, FileType::q3_k_l, FileType::q2_k, FileType::q5_k_s, FileType::iq4_xs,
                             FileType::q4_1, FileType::q5_0}) {
    SCOPED_TRACE(std::string(file_type_name(file_type)));
    const fs::path path = directory_ / fmt::format("{}.gguf", file_type_name(file_type));
    auto error = make_synthetic_model(shape, QuantMixture(file_type, mixture_model(shape)), 3, "mqlm").writer.write(path);
    ASSERT_FALSE(error) << error->detail;
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = 0;
    std::unique_ptr<llama_model, decltype(&llama_model_free)> model(llama_model_load_from_file(path.c_str(), params),
                                                                   llama_model_free);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(llama_model_n_layer(model.get()), 2);
  }
}

}  // namespace
}  // namespace mqlm::model::gguf
