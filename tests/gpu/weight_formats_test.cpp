// The GGUF block encoders and decoders the kernels are checked against: exact layouts on
// hand-built blocks, and round trips within each format's precision.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "gpu/weight_formats.hpp"

namespace mqlm::gpu {
namespace {

TEST(WeightFormats, HalfAndBfloatConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(1e6f), 0x7C00);
  EXPECT_EQ(float_to_half(5.9604645e-8f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3C00);  // a tie rounds to even
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_float(0xC040), -3.0f);
  for (std::uint32_t h = 0; h < 0x7C00; ++h) ASSERT_EQ(float_to_half(half_to_float(static_cast<std::uint16_t>(h))), h);
}

TEST(WeightFormats, Q4_0BlockLayout) {
  std::vector<std::byte> block(18);
  std::uint16_t d = float_to_half(0.5f);
  std::memcpy(block.data(), &d, 2);
  block[2] = std::byte{0x9F};  // element 0: 15 - 8 = 7; element 16: 9 - 8 = 1
  auto x = dequantize(WeightType::q4_0, block, 1, 32);
  EXPECT_EQ(x[0], 3.5f);
  EXPECT_EQ(x[16], 0.5f);
  EXPECT_EQ(x[1], -4.0f);  // nibble 0
}

TEST(WeightFormats, Q4_KScalesAndMinsUnpackAsGgufDoes) {
  std::vector<std::byte> block(144);
  std::uint16_t d = float_to_half(1.0f), dmin = float_to_half(0.5f);
  std::memcpy(block.data(), &d, 2);
  std::memcpy(block.data() + 2, &dmin, 2);
  // Sub-block 5: scale = (scales[9] & 15) | (scales[1] >> 6) << 4, min = (scales[9] >> 4) | (scales[5] >> 6) << 4.
  block[4 + 1] = std::byte{0x40};  // scale high bits 01
  block[4 + 5] = std::byte{0x80};  // min high bits 10
  block[4 + 9] = std::byte{0x32};  // scale low 2, min low 3
  block[16 + 32 * 2] = std::byte{0x70};  // sub-block 5 element 0: high nibble 7
  auto x = dequantize(WeightType::q4_k, block, 1, 256);
  EXPECT_EQ(x[32 * 5], 1.0f * (2 | 16) * 7 - 0.5f * (3 | 32));
}

TEST(WeightFormats, Q5_0KeepsElementEsFifthBitAtBitEOfQh) {
  std::vector<std::byte> block(22);
  std::uint16_t d = float_to_half(1.0f);
  std::memcpy(block.data(), &d, 2);
  std::uint32_t qh = 1u << 17;  // element 17: 16 + (qs[1] >> 4) - 16
  std::memcpy(block.data() + 2, &qh, 4);
  block[6 + 1] = std::byte{0x30};
  auto x = dequantize(WeightType::q5_0, block, 1, 32);
  EXPECT_EQ(x[17], 3.0f);
  EXPECT_EQ(x[1], -16.0f);  // low nibble 0, no fifth bit
}

TEST(WeightFormats, Q6_KInterleavesGroupsOf32WithinHalvesOf128) {
  std::vector<std::byte> block(210);
  std::uint16_t d = float_to_half(0.5f);
  std::memcpy(block.data() + 208, &d, 2);
  // Element 128 + 64 + 3: half 1, group 2: the high nibble of ql[64 + 3], bits 4-5 of qh[32 + 3],
  // the scale of sub-block 12.
  block[64 + 3] = std::byte{0x50};
  block[128 + 32 + 3] = std::byte{0x20};
  block[192 + 12] = std::byte{0xFE};  // -2
  auto x = dequantize(WeightType::q6_k, block, 1, 256);
  EXPECT_EQ(x[128 + 64 + 3], 0.5f * -2 * ((5 | 2 << 4) - 32));
  EXPECT_EQ(x[128 + 3], 0.0f);  // group 0 of the same bytes: scale 0
}

// The relative squared error of each type on N(0, 1), a little above what each measures.
double round_trip_bound(WeightType type) {
  switch (type) {
    case WeightType::f32: return 0;
    case WeightType::f16: return 1e-6;
    case WeightType::bf16: return 1e-4;
    case WeightType::q8_0: return 1e-4;
    case WeightType::q6_k: return 1e-3;
    case WeightType::q5_0:
    case WeightType::q5_1:
    case WeightType::q5_k: return 3e-3;
    case WeightType::q4_0:
    case WeightType::q4_1:
    case WeightType::q4_k:
    case WeightType::iq4_nl:
    case WeightType::iq4_xs: return 1e-2;
    case WeightType::q3_k: return 3e-2;
    case WeightType::q2_k: return 0.1;
  }
  return 0;
}

TEST(WeightFormats, EveryTypeRoundTripsWithinItsPrecision) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> x(4 * 512);
  for (auto& v : x) v = dist(rng);
  for (auto type : all_weight_types) {
    auto bytes = quantize(type, x, 512);
    ASSERT_EQ(bytes.size(), 4 * row_bytes(type, 512));
    ASSERT_EQ(row_bytes(type, 512), 512 / block_elements(type) * block_bytes(type));
    auto y = dequantize(type, bytes, 4, 512);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      err += (y[i] - x[i]) * double(y[i] - x[i]);
      norm += double(x[i]) * x[i];
    }
    EXPECT_LE(err / norm, round_trip_bound(type)) << weight_type_name(type);
  }
  EXPECT_THROW(row_bytes(WeightType::q4_k, 100), std::invalid_argument);
  EXPECT_THROW(row_bytes(WeightType::q5_1, 48), std::invalid_argument);
}

TEST(WeightFormats, RandomWeightsAreSmallFiniteAndVaried) {
  for (auto type : all_weight_types) {
    auto bytes = random_weights(type, 8, 512, 1);
    ASSERT_EQ(bytes.size(), 8 * row_bytes(type, 512));
    EXPECT_EQ(bytes, random_weights(type, 8, 512, 1)) << weight_type_name(type);
    auto x = dequantize(type, bytes, 8, 512);
    double sum_squares = 0;
    for (float v : x) {
      ASSERT_TRUE(std::isfinite(v)) << weight_type_name(type);
      sum_squares += double(v) * v;
    }
    double rms = std::sqrt(sum_squares / static_cast<double>(x.size()));
    bool older = type == WeightType::f32 || type == WeightType::q8_0 || type == WeightType::q4_k;
    if (older) continue;  // up to 1, and 3.4 for Q4_K, as they always were
    EXPECT_GT(rms, 5e-4) << weight_type_name(type);
    EXPECT_LT(rms, 3e-2) << weight_type_name(type);
  }
}

}  // namespace
}  // namespace mqlm::gpu
