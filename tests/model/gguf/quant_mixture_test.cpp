// The names make-model takes for llama-quantize's file types, and the rule's plain parts; the
// rule as a whole is checked against llama.cpp in quant_mixture_oracle_test.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "model/gguf/quant_mixture.hpp"

namespace mqlm::model::gguf {
namespace {

using gpu::WeightType;

TEST(QuantMixture, FileTypeNamesInAnyCaseWithLlamaQuantizesAliases) {
  EXPECT_EQ(parse_file_type("Q4_K_M"), FileType::q4_k_m);
  EXPECT_EQ(parse_file_type("q5_k_s"), FileType::q5_k_s);
  EXPECT_EQ(parse_file_type("Iq4_Xs"), FileType::iq4_xs);
  EXPECT_EQ(parse_file_type("F16"), FileType::f16);
  EXPECT_EQ(parse_file_type("q3_k"), FileType::q3_k_m);
  EXPECT_EQ(parse_file_type("Q4_K"), FileType::q4_k_m);
  EXPECT_EQ(parse_file_type("q5_k"), FileType::q5_k_m);
  EXPECT_EQ(parse_file_type("q7_k"), std::nullopt);
  EXPECT_EQ(parse_file_type("q4_k_m "), std::nullopt);
  EXPECT_EQ(parse_file_type(""), std::nullopt);
  for (FileType type : all_file_types) EXPECT_EQ(parse_file_type(file_type_name(type)), type);
  EXPECT_EQ(file_type_names().size(), std::size(all_file_types) + 3);
}

TEST(QuantMixture, EveryWeightTypeHasAFileTypeOfItsOwn) {
  for (WeightType type : gpu::all_weight_types) EXPECT_EQ(default_weight_type(file_type_of(type)), type);
  EXPECT_EQ(file_type_of(WeightType::q4_k), FileType::q4_k_s);  // llama.cpp's name for all-Q4_K files
  EXPECT_EQ(static_cast<std::uint32_t>(FileType::q4_k_m), 15u);   // llama_ftype's value
}

TEST(QuantMixture, FallbacksWhereRowsAreNotWholeBlocks) {
  EXPECT_EQ(fitting_type(WeightType::q4_k, 512), WeightType::q4_k);
  EXPECT_EQ(fitting_type(WeightType::q4_k, 320), WeightType::q5_0);
  EXPECT_EQ(fitting_type(WeightType::q5_k, 320), WeightType::q5_1);
  EXPECT_EQ(fitting_type(WeightType::q6_k, 320), WeightType::q8_0);
  EXPECT_EQ(fitting_type(WeightType::q3_k, 320), WeightType::q4_0);
  EXPECT_EQ(fitting_type(WeightType::iq4_xs, 320), WeightType::iq4_nl);
  EXPECT_EQ(fitting_type(WeightType::q6_k, 336), WeightType::f16);
  EXPECT_EQ(fitting_type(WeightType::q4_0, 336), WeightType::f16);
  EXPECT_EQ(fitting_type(WeightType::bf16, 7), WeightType::bf16);
}

// Llama 3 8B's shape: 32 layers, 4 heads per KV head.
TEST(QuantMixture, Q4KMOfLlama3_8b) {
  QuantMixture q4_k_m(FileType::q4_k_m, {.arch = "llama", .layers = 32, .heads = 32, .kv_heads = 8});
  std::vector<std::uint32_t> q6_k_layers;
  for (std::uint32_t layer = 0; layer < 32; ++layer) {
    auto attn_v = q4_k_m.matrix_type(fmt::format("blk.{}.attn_v.weight", layer), 4096).type;
    EXPECT_EQ(q4_k_m.matrix_type(fmt::format("blk.{}.ffn_down.weight", layer), 14336).type, attn_v);
    EXPECT_EQ(q4_k_m.matrix_type(fmt::format("blk.{}.attn_q.weight", layer), 4096).type, WeightType::q4_k);
    if (attn_v == WeightType::q6_k) q6_k_layers.push_back(layer);
  }
  // The first and last eighth (layers 0-3, 28-31) and every third layer between, from 6.
  EXPECT_EQ(q6_k_layers, (std::vector<std::uint32_t>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
  EXPECT_EQ(q4_k_m.matrix_type("output.weight", 4096).type, WeightType::q6_k);
  EXPECT_EQ(q4_k_m.matrix_type("token_embd.weight", 4096).type, WeightType::q4_k);
  QuantMixture pure(FileType::q4_k_m, {.layers = 32, .heads = 32, .kv_heads = 8}, /*pure=*/true);
  EXPECT_EQ(pure.matrix_type("output.weight", 4096).type, WeightType::q4_k);
}

}  // namespace
}  // namespace mqlm::model::gguf
