// The GPU kernels of every quantized type against llama.cpp's own reading of the same bytes: blocks
// of random content (every quant bit pattern, scales of every magnitude) dequantized by ggml
// (its type traits' to_float) are what the kernels must compute with. Gathering rows, the F16
// form the tensor cores take, the int8 mat-vec and the general product, on lavapipe.
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <ggml.h>
#include <gtest/gtest.h>

#include "gpu/ops.hpp"
#include "gpu/reference_ops.hpp"
#include "gpu/weight_formats.hpp"
#include "gpu_fixture.hpp"

namespace mqlm::gpu {
namespace {

using testing::Gpu;
using testing::normalised_error;
using testing::random_vec;
using testing::run_step;
using testing::shared_gpu;
using Vec = std::vector<float>;

struct TypeCase {
  WeightType type;
  ggml_type ggml;
  std::vector<std::size_t> half_fields;  // byte offsets of the F16 scales in a block
};

const std::vector<TypeCase>& type_cases() {
  static const std::vector<TypeCase> cases{
      {WeightType::q4_0, GGML_TYPE_Q4_0, {0}},      {WeightType::q8_0, GGML_TYPE_Q8_0, {0}},
      {WeightType::q4_1, GGML_TYPE_Q4_1, {0, 2}},   {WeightType::q5_0, GGML_TYPE_Q5_0, {0}},
      {WeightType::q5_1, GGML_TYPE_Q5_1, {0, 2}},   {WeightType::iq4_nl, GGML_TYPE_IQ4_NL, {0}},
      {WeightType::q2_k, GGML_TYPE_Q2_K, {80, 82}}, {WeightType::q3_k, GGML_TYPE_Q3_K, {108}},
      {WeightType::q4_k, GGML_TYPE_Q4_K, {0, 2}},   {WeightType::q5_k, GGML_TYPE_Q5_K, {0, 2}},
      {WeightType::q6_k, GGML_TYPE_Q6_K, {208}},    {WeightType::iq4_xs, GGML_TYPE_IQ4_XS, {0}},
  };
  return cases;
}

std::ostream& operator<<(std::ostream& os, const TypeCase& c) { return os << weight_type_name(c.type); }

// Random bytes, each block's scales set to finite halves of magnitudes 2^-14 .. 2^-4 and either
// sign (every other bit pattern is a valid block).
std::vector<std::byte> random_blocks(const TypeCase& c, std::size_t rows, std::size_t k, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> bytes(rows * row_bytes(c.type, k));
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
  const std::size_t bb = block_bytes(c.type);
  for (std::size_t at = 0; at < bytes.size(); at += bb) {
    for (std::size_t field : c.half_fields) {
      const float magnitude = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, -14 + static_cast<int>(rng() % 11));
      const std::uint16_t h = float_to_half((rng() & 1) ? -magnitude : magnitude);
      std::memcpy(bytes.data() + at + field, &h, 2);
    }
  }
  return bytes;
}

Vec ggml_dequantize(const TypeCase& c, const std::vector<std::byte>& bytes, std::size_t rows, std::size_t k) {
  Vec out(rows * k);
  ggml_get_type_traits(c.ggml)->to_float(bytes.data(), out.data(), static_cast<std::int64_t>(out.size()));
  return out;
}

class QuantKernels : public ::testing::TestWithParam<TypeCase> {
 protected:
  static constexpr std::size_t kRows = 36, kCols = 512;  // rows not a multiple of 16 or of 8
  void SetUp() override {
    bytes_ = random_blocks(GetParam(), kRows, kCols, 7 + static_cast<std::uint64_t>(GetParam().type));
    want_ = ggml_dequantize(GetParam(), bytes_, kRows, kCols);
  }
  std::vector<std::byte> bytes_;
  Vec want_;
};

TEST_P(QuantKernels, GatheredRowsAreGgmlsValues) {
  Gpu& gpu = shared_gpu();
  const std::vector<std::uint32_t> ids{35, 0, 17, 17, 2};
  auto w = gpu.up(bytes_), bids = gpu.up(ids), out = gpu.scratch(ids.size() * kCols * 4);
  run_step(gpu, [&](Recording& rec) {
    ops::get_rows(rec, gpu.kernels, GetParam().type, w.range(), bids.range(), out.range(), kCols,
                  static_cast<std::uint32_t>(ids.size()));
  });
  const Vec got = gpu.down<float>(out, ids.size() * kCols);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (std::size_t j = 0; j < kCols; ++j) {
      const float want = want_[ids[i] * kCols + j];
      ASSERT_NEAR(got[i * kCols + j], want, std::fabs(want) * 1e-6f) << "row " << ids[i] << " element " << j;
    }
  }
}

TEST_P(QuantKernels, F16FormIsGgmlsValuesRounded) {
  Gpu& gpu = shared_gpu();
  auto w = gpu.up(bytes_), out = gpu.scratch(kRows * kCols * 2);
  run_step(gpu, [&](Recording& rec) {
    ops::dequantize_f16(rec, gpu.kernels, GetParam().type, w.range(), out.range(), kRows, kCols);
  });
  const auto got = gpu.down<std::uint16_t>(out, kRows * kCols);
  std::size_t off = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    // One rounding to F16 of the F32 value (or of its fused form: at most one F16 ulp apart).
    const float want = half_to_float(float_to_half(want_[i])), have = half_to_float(got[i]);
    if (have != want) {
      ++off;
      ASSERT_NEAR(have, want, std::fabs(want) * 1e-3f) << "element " << i;
    }
  }
  EXPECT_LE(off, got.size() / 100) << "elements one F16 ulp off";
}

// The int8 mat-vec (activations quantized on the GPU first) and the general product, against the
// product of ggml's weights with the activations each kernel sees.
TEST_P(QuantKernels, ProductsUseGgmlsValues) {
  Gpu& gpu = shared_gpu();
  const WeightType type = GetParam().type;
  for (std::uint32_t n : {1u, 3u, 8u, 21u}) {
    SCOPED_TRACE(fmt::format("{} columns", n));
    const Vec acts = random_vec(n * kCols, n);
    auto w = gpu.up(bytes_), a = gpu.up(acts), out = gpu.scratch(n * kRows * 4);
    const bool int8 = ops::matvec_q8_applies(gpu.device.features(), type, kCols, n);
    auto q8 = gpu.scratch(ops::q8_acts_bytes(kCols, n));
    run_step(gpu, [&](Recording& rec) {
      if (int8) {
        ops::quantize_q8(rec, gpu.kernels, a.range(), q8.range(), kCols, n);
        ops::matvec_q8(rec, gpu.kernels, type, w.range(), q8.range(), out.range(), kRows, kCols, n, false);
      } else {
        ops::matmul(rec, gpu.kernels, type, w.range(), a.range(), false, out.range(), kRows, kCols, n);
      }
    });
    const Vec want = reference::matmul(want_, int8 ? reference::int8_blocks(acts) : acts, kRows, kCols, n);
    EXPECT_LT(normalised_error(gpu.down<float>(out, n * kRows), want), 1e-9) << (int8 ? "int8 mat-vec" : "general");
  }
}

INSTANTIATE_TEST_SUITE_P(EveryType, QuantKernels, ::testing::ValuesIn(type_cases()),
                         [](const auto& info) { return std::string(weight_type_name(info.param.type)); });

}  // namespace
}  // namespace mqlm::gpu
