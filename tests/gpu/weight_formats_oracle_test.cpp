// mqlm's weight formats against llama.cpp's own (libggml-base, the oracle): every quantized type
// decodes bit for bit as ggml's to_float does, on random blocks with extreme scales and on the blocks
// ggml's own quantizers write; what mqlm's quantizers write means the same to ggml; and they lose
// not much more than ggml's reference quantizers (ggml_quantize_chunk without an importance matrix)
// on weight-like data.
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <ggml.h>
#include <gtest/gtest.h>

#include "gpu/weight_formats.hpp"

namespace mqlm::gpu {
namespace {

struct OracleType {
  WeightType type;
  ggml_type ggml;
  std::vector<std::size_t> half_fields;  // byte offsets of the block's half scales (d, dmin, m)
};

// The offsets come from ggml-common.h's block structs, independently of mqlm's code.
const OracleType kTypes[] = {
    {WeightType::f16, GGML_TYPE_F16, {0}},       {WeightType::q8_0, GGML_TYPE_Q8_0, {0}},
    {WeightType::q4_0, GGML_TYPE_Q4_0, {0}},     {WeightType::q4_1, GGML_TYPE_Q4_1, {0, 2}},
    {WeightType::q5_0, GGML_TYPE_Q5_0, {0}},     {WeightType::q5_1, GGML_TYPE_Q5_1, {0, 2}},
    {WeightType::iq4_nl, GGML_TYPE_IQ4_NL, {0}}, {WeightType::q2_k, GGML_TYPE_Q2_K, {80, 82}},
    {WeightType::q3_k, GGML_TYPE_Q3_K, {108}},   {WeightType::q4_k, GGML_TYPE_Q4_K, {0, 2}},
    {WeightType::q5_k, GGML_TYPE_Q5_K, {0, 2}},  {WeightType::q6_k, GGML_TYPE_Q6_K, {208}},
    {WeightType::iq4_xs, GGML_TYPE_IQ4_XS, {0}},
};

void PrintTo(const OracleType& t, std::ostream* os) { *os << weight_type_name(t.type); }

std::string name_of(const testing::TestParamInfo<OracleType>& info) {
  return std::string(weight_type_name(info.param.type));
}

std::vector<float> ggml_dequantize(const OracleType& t, std::span<const std::byte> bytes, std::size_t count) {
  std::vector<float> out(count);
  ggml_get_type_traits(t.ggml)->to_float(bytes.data(), out.data(), static_cast<std::int64_t>(count));
  return out;
}

// Every value's bit pattern equal: -0 against +0, or a last-bit rounding difference, fails.
void expect_bitwise_equal(std::span<const float> mqlm, std::span<const float> ggml, std::size_t block_elements) {
  ASSERT_EQ(mqlm.size(), ggml.size());
  for (std::size_t i = 0; i < mqlm.size(); ++i) {
    ASSERT_FALSE(std::isnan(ggml[i])) << "element " << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(mqlm[i]), std::bit_cast<std::uint32_t>(ggml[i]))
        << "element " << i << " (block " << i / block_elements << ", position " << i % block_elements
        << "): mqlm " << mqlm[i] << ", ggml " << ggml[i];
  }
}

// Finite halves from zero and the smallest subnormal to 65504, of both signs; the last is drawn at random.
std::uint16_t spread_half(std::size_t pick, std::mt19937_64& rng) {
  static constexpr std::uint16_t extremes[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x1800, 0x3C00,
                                               0xBC00, 0x7B53 /* 60000 */, 0xFBFF /* -65504 */};
  if (pick < std::size(extremes)) return extremes[pick];
  auto bits = static_cast<std::uint16_t>(rng());
  return (bits & 0x7C00) == 0x7C00 ? static_cast<std::uint16_t>(bits & 0xBFFF) : bits;  // no Inf or NaN
}

std::vector<float> normal_weights(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(count);
  for (auto& v : x) v = normal(rng);
  return x;
}

// ggml's reference quantizer, as llama-quantize runs it without an importance matrix.
std::vector<std::byte> ggml_quantize(const OracleType& t, std::span<const float> x, std::size_t rows, std::size_t k) {
  std::vector<std::byte> bytes(rows * row_bytes(t.type, k));
  ggml_quantize_init(t.ggml);  // IQ4_NL and IQ4_XS need their tables
  ggml_quantize_chunk(t.ggml, x.data(), bytes.data(), 0, static_cast<std::int64_t>(rows), static_cast<std::int64_t>(k), nullptr);
  return bytes;
}

double rms_error(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum / static_cast<double>(a.size()));
}

class WeightFormatsOracle : public testing::TestWithParam<OracleType> {};

TEST_P(WeightFormatsOracle, BlockSizesAreGgmls) {
  const auto* traits = ggml_get_type_traits(GetParam().ggml);
  EXPECT_EQ(block_elements(GetParam().type), static_cast<std::size_t>(traits->blck_size));
  EXPECT_EQ(block_bytes(GetParam().type), traits->type_size);
}

TEST_P(WeightFormatsOracle, RandomBlocksWithExtremeScalesDecodeBitForBitAsGgml) {
  const OracleType& t = GetParam();
  const std::size_t blocks = 2048, count = blocks * block_elements(t.type);
  std::mt19937_64 rng(static_cast<std::uint64_t>(t.ggml) + 1);
  std::vector<std::byte> bytes(blocks * block_bytes(t.type));
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t f = 0; f < t.half_fields.size(); ++f) {
      std::uint16_t half = spread_half((b + 3 * f) % 16, rng);
      std::memcpy(bytes.data() + b * block_bytes(t.type) + t.half_fields[f], &half, 2);
    }
  }
  expect_bitwise_equal(dequantize(t.type, bytes, 1, count), ggml_dequantize(t, bytes, count), block_elements(t.type));
}

TEST_P(WeightFormatsOracle, QuantizedBlocksMeanToGgmlWhatTheyMeanToMqlm) {
  const OracleType& t = GetParam();
  const std::size_t k = 1024;
  std::vector<float> x = normal_weights(4 * k, 7);
  std::fill(x.begin(), x.begin() + k, 0.0f);          // a row of zeros
  std::fill(x.begin() + k, x.begin() + 2 * k, 3e-3f);  // a constant row
  x[2 * k + 5] = 40.0f;                                // one outlier
  auto bytes = quantize(t.type, x, k);
  EXPECT_TRUE(ggml_validate_row_data(t.ggml, bytes.data(), bytes.size()));  // llama.cpp checks this at load
  expect_bitwise_equal(dequantize(t.type, bytes, 4, k), ggml_dequantize(t, bytes, 4 * k), block_elements(t.type));
}

TEST_P(WeightFormatsOracle, RandomWeightsAreBlocksGgmlAccepts) {
  const OracleType& t = GetParam();
  auto bytes = random_weights(t.type, 16, 1024, 3);
  EXPECT_TRUE(ggml_validate_row_data(t.ggml, bytes.data(), bytes.size()));
  auto x = ggml_dequantize(t, bytes, 16 * 1024);
  expect_bitwise_equal(dequantize(t.type, bytes, 16, 1024), x, block_elements(t.type));
}

TEST_P(WeightFormatsOracle, GgmlsQuantizedBlocksDecodeInMqlmAsInGgml) {
  const OracleType& t = GetParam();
  const std::size_t rows = 8, k = 1024;
  std::vector<float> x = normal_weights(rows * k, 13);
  auto bytes = ggml_quantize(t, x, rows, k);
  expect_bitwise_equal(dequantize(t.type, bytes, rows, k), ggml_dequantize(t, bytes, rows * k), block_elements(t.type));
}

TEST_P(WeightFormatsOracle, QuantizerLosesAtMostHalfAgainGgmlsReference) {
  const OracleType& t = GetParam();
  const std::size_t rows = 32, k = 1024;
  std::vector<float> x = normal_weights(rows * k, 11);
  auto ours = dequantize(t.type, quantize(t.type, x, k), rows, k);
  auto theirs = ggml_dequantize(t, ggml_quantize(t, x, rows, k), rows * k);
  double ours_rms = rms_error(ours, x), theirs_rms = rms_error(theirs, x);
  std::printf("%-7s RMS error on normal(0, 0.02): mqlm %.4g, ggml %.4g (%.3fx)\n",
              std::string(weight_type_name(t.type)).c_str(), ours_rms, theirs_rms, ours_rms / theirs_rms);
  EXPECT_LE(ours_rms, 1.5 * theirs_rms);
}

INSTANTIATE_TEST_SUITE_P(EveryType, WeightFormatsOracle, testing::ValuesIn(kTypes), name_of);

}  // namespace
}  // namespace mqlm::gpu
