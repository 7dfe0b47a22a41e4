#include "gpu/weight_formats.hpp"

#include "gpu/weight_format_blocks.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mqlm::gpu {

std::string_view weight_type_name(WeightType type) {
  switch (type) {
    case WeightType::f32: return "f32";
    case WeightType::f16: return "f16";
    case WeightType::bf16: return "bf16";
    case WeightType::q8_0: return "q8_0";
    case WeightType::q4_0: return "q4_0";
    case WeightType::q4_k: return "q4_k";
    case WeightType::q4_1: return "q4_1";
    case WeightType::q5_0: return "q5_0";
    case WeightType::q5_1: return "q5_1";
    case WeightType::q2_k: return "q2_k";
    case WeightType::q3_k: return "q3_k";
    case WeightType::q5_k: return "q5_k";
    case WeightType::q6_k: return "q6_k";
    case WeightType::iq4_nl: return "iq4_nl";
    case WeightType::iq4_xs: return "iq4_xs";
  }
  return "unknown";
}

std::optional<WeightType> parse_weight_type(std::string_view name) {
  for (auto type : all_weight_types) {
    if (weight_type_name(type) == name) return type;
  }
  return std::nullopt;
}

std::size_t block_elements(WeightType type) {
  switch (type) {
    case WeightType::f32:
    case WeightType::f16:
    case WeightType::bf16: return 1;
    case WeightType::q8_0:
    case WeightType::q4_0:
    case WeightType::q4_1:
    case WeightType::q5_0:
    case WeightType::q5_1:
    case WeightType::iq4_nl: return 32;
    case WeightType::q4_k:
    case WeightType::q2_k:
    case WeightType::q3_k:
    case WeightType::q5_k:
    case WeightType::q6_k:
    case WeightType::iq4_xs: return 256;
  }
  return 1;
}

std::size_t block_bytes(WeightType type) {
  switch (type) {
    case WeightType::f32: return 4;
    case WeightType::f16:
    case WeightType::bf16: return 2;
    case WeightType::q8_0: return 34;
    case WeightType::q4_0: return 18;
    case WeightType::q4_k: return 144;
    case WeightType::q4_1: return 20;
    case WeightType::q5_0: return 22;
    case WeightType::q5_1: return 24;
    case WeightType::q2_k: return 84;
    case WeightType::q3_k: return 110;
    case WeightType::q5_k: return 176;
    case WeightType::q6_k: return 210;
    case WeightType::iq4_nl: return 18;
    case WeightType::iq4_xs: return 136;
  }
  return 0;
}

std::size_t row_bytes(WeightType type, std::size_t k) {
  if (k % block_elements(type) != 0) {
    throw std::invalid_argument("a row of " + std::to_string(k) + " elements is not a whole number of " +
                                std::string(weight_type_name(type)) + " blocks of " +
                                std::to_string(block_elements(type)));
  }
  return k / block_elements(type) * block_bytes(type);
}

std::uint16_t float_to_half(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<std::uint16_t>(sign | (abs > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // subnormal half (or zero): value / 2^-24, rounded to nearest even
    float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  std::uint32_t mantissa = abs & 0x7FFFFFu;
  std::uint32_t exponent = (abs >> 23) - 127 + 15;
  std::uint32_t half = (exponent << 10) | (mantissa >> 13);
  std::uint32_t rest = mantissa & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float half_to_float(std::uint16_t bits) {
  std::uint32_t sign = (bits & 0x8000u) << 16;
  std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    float v = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -v : v;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

std::uint16_t float_to_bf16(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

namespace {

using blocks::BlockCodec;
using blocks::RandomBits;

void quantize_f32(const float* x, std::byte* out) { std::memcpy(out, x, 4); }
void dequantize_f32(const std::byte* in, float* x) { std::memcpy(x, in, 4); }
void randomize_f32(std::byte* p, RandomBits& bits) {
  float v = static_cast<float>(static_cast<std::int32_t>(bits.next() >> 32)) * 4.6e-10f;  // |x| < 1
  std::memcpy(p, &v, 4);
}
void quantize_f16(const float* x, std::byte* out) { blocks::put16(out, float_to_half(*x)); }
void dequantize_f16(const std::byte* in, float* x) { *x = blocks::get_half(in); }
void randomize_f16(std::byte* p, RandomBits& bits) { blocks::put16(p, bits.half(6)); }
void quantize_bf16(const float* x, std::byte* out) { blocks::put16(out, float_to_bf16(*x)); }
void dequantize_bf16(const std::byte* in, float* x) { *x = bf16_to_float(blocks::get16(in)); }
void randomize_bf16(std::byte* p, RandomBits& bits) {
  blocks::put16(p, static_cast<std::uint16_t>(0x3A00u | (bits.next() & 0x80FFu)));  // |x| ~ 5e-4..1e-3
}

const BlockCodec& codec(WeightType type) {
  static constexpr BlockCodec f32{quantize_f32, dequantize_f32, randomize_f32};
  static constexpr BlockCodec f16{quantize_f16, dequantize_f16, randomize_f16};
  static constexpr BlockCodec bf16{quantize_bf16, dequantize_bf16, randomize_bf16};
  switch (type) {
    case WeightType::f32: return f32;
    case WeightType::f16: return f16;
    case WeightType::bf16: return bf16;
    default: return block_elements(type) == 32 ? blocks::small_block_codec(type) : blocks::k_quant_codec(type);
  }
}

}  // namespace

std::vector<std::byte> quantize(WeightType type, std::span<const float> values, std::size_t k) {
  std::size_t rows = k == 0 ? 0 : values.size() / k;
  std::size_t be = block_elements(type), bb = block_bytes(type);
  std::vector<std::byte> out(rows * row_bytes(type, k));
  const BlockCodec& c = codec(type);
  for (std::size_t b = 0; b < out.size() / bb; ++b) c.quantize(values.data() + b * be, out.data() + b * bb);
  return out;
}

std::vector<float> dequantize(WeightType type, std::span<const std::byte> data, std::size_t rows, std::size_t k) {
  std::size_t blocks = rows * row_bytes(type, k) / block_bytes(type);
  if (data.size() < blocks * block_bytes(type)) throw std::invalid_argument("dequantize: data shorter than rows x k");
  std::vector<float> out(rows * k);
  const BlockCodec& c = codec(type);
  for (std::size_t b = 0; b < blocks; ++b) c.dequantize(data.data() + b * block_bytes(type), out.data() + b * block_elements(type));
  return out;
}

std::vector<std::byte> random_weights(WeightType type, std::size_t rows, std::size_t k, std::uint64_t seed) {
  std::vector<std::byte> out(rows * row_bytes(type, k));
  RandomBits bits(seed);
  for (std::size_t i = 0; i + 8 <= out.size(); i += 8) {
    std::uint64_t r = bits.next();
    std::memcpy(out.data() + i, &r, 8);
  }
  std::size_t bb = block_bytes(type);
  const BlockCodec& c = codec(type);
  for (std::size_t b = 0; b < out.size() / bb; ++b) c.randomize(out.data() + b * bb, bits);
  return out;
}

}  // namespace mqlm::gpu
