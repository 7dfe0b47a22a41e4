// The weight types the matrix kernels read in place, with GGUF's block layouts:
//   F32, F16, BF16       one value per element
//   Q8_0  32 values in 34 bytes:  f16 d, int8 q[32];                       x = d * q
//   Q4_0  32 values in 18 bytes:  f16 d, uint8 qs[16];  x[j] = d * ((qs[j] & 15) - 8),
//                                                        x[j + 16] = d * ((qs[j] >> 4) - 8)
//   Q4_K 256 values in 144 bytes: f16 d, f16 dmin, uint8 scales[12] (eight 6-bit scales and
//        mins), uint8 qs[128]; sub-block s of 32 uses nibble (s & 1) of qs[32 * (s / 2) + l]:
//        x = d * scale[s] * nibble - dmin * min[s]
//   Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS: ggml's layouts (ggml-common.h);
//        block_elements / block_bytes below give their sizes.
// Plain C++ conversions here are the reference the GPU kernels are tested against; llama.cpp's
// own (libggml-base) are theirs, in tests/gpu/weight_formats_oracle_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace mqlm::gpu {

enum class WeightType : std::uint8_t {
  f32, f16, bf16, q8_0, q4_0, q4_k, q4_1, q5_0, q5_1, q2_k, q3_k, q5_k, q6_k, iq4_nl, iq4_xs
};
inline constexpr WeightType all_weight_types[] = {
    WeightType::f32,  WeightType::f16,  WeightType::bf16, WeightType::q8_0, WeightType::q4_0,
    WeightType::q4_k, WeightType::q4_1, WeightType::q5_0, WeightType::q5_1, WeightType::q2_k,
    WeightType::q3_k, WeightType::q5_k, WeightType::q6_k, WeightType::iq4_nl, WeightType::iq4_xs};

std::string_view weight_type_name(WeightType type);  // "f32", "q4_k", ...
std::optional<WeightType> parse_weight_type(std::string_view name);
std::size_t block_elements(WeightType type);  // 1, 32 or 256
std::size_t block_bytes(WeightType type);
// Bytes of one row of k elements; throws std::invalid_argument unless k is a multiple of the block.
std::size_t row_bytes(WeightType type, std::size_t k);

std::uint16_t float_to_half(float value);  // round to nearest even
float half_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);  // round to nearest even
float bf16_to_float(std::uint16_t bits);

// values: (rows, k) row-major; returns the rows encoded back to back.
std::vector<std::byte> quantize(WeightType type, std::span<const float> values, std::size_t k);
std::vector<float> dequantize(WeightType type, std::span<const std::byte> data, std::size_t rows, std::size_t k);
// Valid (finite) weights of arbitrary content, fast enough for benchmark-sized matrices.
std::vector<std::byte> random_weights(WeightType type, std::size_t rows, std::size_t k, std::uint64_t seed);

}  // namespace mqlm::gpu
