// The weight types the matrix kernels read in place, with GGUF's block layouts (ggml-common.h;
// halves are IEEE binary16, multi-byte fields little-endian; x[e] is element e of the block):
//   F32, F16, BF16       one value per element
//   Q8_0   32 in 34 bytes:  f16 d, int8 q[32];                  x[e] = q[e] * d
//   Q4_0   32 in 18 bytes:  f16 d, u8 qs[16];                   x[j] = ((qs[j] & 15) - 8) * d,
//                                                                x[j + 16] = ((qs[j] >> 4) - 8) * d
//   Q4_1   32 in 20 bytes:  f16 d, f16 m, u8 qs[16];            x = q * d + m, q as Q4_0's (no -8)
//   Q5_0   32 in 22 bytes:  f16 d, u32 qh, u8 qs[16];           q as Q4_0's | bit e of qh << 4; x = (q - 16) * d
//   Q5_1   32 in 24 bytes:  f16 d, f16 m, u32 qh, u8 qs[16];    x = q * d + m, q as Q5_0's
//   IQ4_NL 32 in 18 bytes:  f16 d, u8 qs[16];                   x = d * levels[q], q as Q4_1's, levels below
//   Q2_K  256 in 84 bytes:  u8 scales[16] (sc | mn << 4), u8 qs[64], f16 d, f16 dmin; sub-block s = e / 16;
//        e = 128 h + 32 g + l: q = (qs[32 h + l] >> 2 g) & 3; x = (d * sc) * q - dmin * mn
//   Q3_K  256 in 110 bytes: u8 hmask[32], u8 qs[64], u8 scales[12] (sixteen 6-bit sc + 32), f16 d;
//        q = ((qs[32 h + l] >> 2 g) & 3) - (bit 4 h + g of hmask[l] ? 0 : 4); x = (d * sc[e / 16]) * q
//   Q4_K  256 in 144 bytes: f16 d, f16 dmin, u8 scales[12] (eight 6-bit scales and mins), u8 qs[128];
//        sub-block s = e / 32 uses nibble (s & 1) of qs[32 * (s / 2) + l]: x = (d * sc[s]) * q - dmin * mn[s]
//   Q5_K  256 in 176 bytes: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]; q as Q4_K's
//        | bit s of qh[l] << 4, x as Q4_K's
//   Q6_K  256 in 210 bytes: u8 ql[128], u8 qh[64], int8 sc[16], f16 d; e = 128 h + 32 g + l:
//        q = (nibble g / 2 of ql[64 h + 32 (g & 1) + l] | bits 2 g of qh[32 h + l] << 4) - 32; x = (d * sc[e / 16]) * q
//   IQ4_XS 256 in 136 bytes: f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128]; sub-block s of 32 as an
//        IQ4_NL block with d * (sc - 32), sc = nibble s % 2 of scales_l[s / 2] | bits 2 s of scales_h << 4
//   IQ4 levels: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113
// Plain C++ conversions here (gpu/small_block_quants.cpp, gpu/k_quants.cpp) are the reference the
// GPU kernels are tested against; they decode bit for bit as llama.cpp's own (libggml-base) do,
// which tests/gpu/weight_formats_oracle_test.cpp checks.
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
inline bool quantized(WeightType type) { return block_elements(type) > 1; }  // not F32, F16, BF16
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
// Valid (finite) weights of arbitrary content, fast enough for benchmark-sized matrices: |x| ~ 1e-3
// to 1e-2 (F32 up to 1, Q8_0 0.5, Q4_K 3.4, as those always came).
std::vector<std::byte> random_weights(WeightType type, std::size_t rows, std::size_t k, std::uint64_t seed);

}  // namespace mqlm::gpu
