#include "gpu/weight_formats.hpp"

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

void put16(std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); }
std::uint16_t get16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void quantize_q8_0(const float* x, std::byte* out) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  float d = amax / 127.0f;
  put16(out, float_to_half(d));
  for (int j = 0; j < 32; ++j) {
    int q = d == 0 ? 0 : static_cast<int>(std::lround(x[j] / d));
    out[2 + j] = static_cast<std::byte>(static_cast<std::int8_t>(std::clamp(q, -127, 127)));
  }
}

void quantize_q4_0(const float* x, std::byte* out) {
  float max = 0;  // the value of largest magnitude, with its sign, maps to -8
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > std::fabs(max)) max = x[j];
  }
  float d = max / -8.0f;
  put16(out, float_to_half(d));
  auto q = [&](int j) { return d == 0 ? 8 : std::clamp(static_cast<int>(std::lround(x[j] / d)) + 8, 0, 15); };
  for (int j = 0; j < 16; ++j) out[2 + j] = static_cast<std::byte>(q(j) | (q(j + 16) << 4));
}

void quantize_q4_k(const float* x, std::byte* out) {
  float scales[8], mins[8];
  for (int s = 0; s < 8; ++s) {
    float lo = 0, hi = 0;  // min is clamped to <= 0 so that x = scale * q - min covers zero
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[32 * s + l]);
      hi = std::max(hi, x[32 * s + l]);
    }
    scales[s] = (hi - lo) / 15.0f;
    mins[s] = -lo;
  }
  float max_scale = *std::max_element(scales, scales + 8), max_min = *std::max_element(mins, mins + 8);
  float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  std::uint16_t d16 = float_to_half(d), dmin16 = float_to_half(dmin);
  put16(out, d16);
  put16(out + 2, dmin16);
  d = half_to_float(d16);
  dmin = half_to_float(dmin16);
  std::uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d == 0 ? 0 : static_cast<std::uint8_t>(std::clamp<long>(std::lround(scales[s] / d), 0, 63));
    mn[s] = dmin == 0 ? 0 : static_cast<std::uint8_t>(std::clamp<long>(std::lround(mins[s] / dmin), 0, 63));
  }
  std::uint8_t packed[12];
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  std::memcpy(out + 4, packed, 12);
  std::uint8_t qs[128] = {};
  for (int s = 0; s < 8; ++s) {
    float step = d * sc[s], offset = dmin * mn[s];
    for (int l = 0; l < 32; ++l) {
      int q = step == 0 ? 0 : std::clamp(static_cast<int>(std::lround((x[32 * s + l] + offset) / step)), 0, 15);
      qs[32 * (s / 2) + l] |= static_cast<std::uint8_t>(q << (4 * (s & 1)));
    }
  }
  std::memcpy(out + 16, qs, 128);
}

void dequantize_block(WeightType type, const std::byte* in, float* x) {
  auto u8 = [&](std::size_t i) { return std::to_integer<std::uint8_t>(in[i]); };
  switch (type) {
    case WeightType::f32: std::memcpy(x, in, 4); break;
    case WeightType::f16: x[0] = half_to_float(get16(in)); break;
    case WeightType::bf16: x[0] = bf16_to_float(get16(in)); break;
    case WeightType::q8_0: {
      float d = half_to_float(get16(in));
      for (int j = 0; j < 32; ++j) x[j] = d * static_cast<float>(static_cast<std::int8_t>(u8(2 + j)));
      break;
    }
    case WeightType::q4_0: {
      float d = half_to_float(get16(in));
      for (int j = 0; j < 16; ++j) {
        x[j] = d * static_cast<float>((u8(2 + j) & 15) - 8);
        x[j + 16] = d * static_cast<float>((u8(2 + j) >> 4) - 8);
      }
      break;
    }
    case WeightType::q4_k: {
      float d = half_to_float(get16(in)), dmin = half_to_float(get16(in + 2));
      const std::size_t scales = 4, qs = 16;
      for (int s = 0; s < 8; ++s) {
        int sc, mn;
        if (s < 4) {
          sc = u8(scales + s) & 63;
          mn = u8(scales + s + 4) & 63;
        } else {
          sc = (u8(scales + s + 4) & 15) | ((u8(scales + s - 4) >> 6) << 4);
          mn = (u8(scales + s + 4) >> 4) | ((u8(scales + s) >> 6) << 4);
        }
        for (int l = 0; l < 32; ++l) {
          int q = (u8(qs + 32 * (s / 2) + l) >> (4 * (s & 1))) & 15;
          x[32 * s + l] = d * sc * q - dmin * mn;
        }
      }
      break;
    }
    default: throw std::invalid_argument("dequantize: " + std::string(weight_type_name(type)) + " is not written yet");
  }
}

}  // namespace

std::vector<std::byte> quantize(WeightType type, std::span<const float> values, std::size_t k) {
  std::size_t rows = k == 0 ? 0 : values.size() / k;
  std::size_t per_row = row_bytes(type, k), be = block_elements(type), bb = block_bytes(type);
  std::vector<std::byte> out(rows * per_row);
  for (std::size_t b = 0; b < values.size() / be; ++b) {
    const float* x = values.data() + b * be;
    std::byte* o = out.data() + b * bb;
    switch (type) {
      case WeightType::f32: std::memcpy(o, x, 4); break;
      case WeightType::f16: put16(o, float_to_half(*x)); break;
      case WeightType::bf16: put16(o, float_to_bf16(*x)); break;
      case WeightType::q8_0: quantize_q8_0(x, o); break;
      case WeightType::q4_0: quantize_q4_0(x, o); break;
      case WeightType::q4_k: quantize_q4_k(x, o); break;
      default: throw std::invalid_argument("quantize: " + std::string(weight_type_name(type)) + " is not written yet");
    }
  }
  return out;
}

std::vector<float> dequantize(WeightType type, std::span<const std::byte> data, std::size_t rows, std::size_t k) {
  std::size_t blocks = rows * row_bytes(type, k) / block_bytes(type);
  if (data.size() < blocks * block_bytes(type)) throw std::invalid_argument("dequantize: data shorter than rows x k");
  std::vector<float> out(rows * k);
  for (std::size_t b = 0; b < blocks; ++b) {
    dequantize_block(type, data.data() + b * block_bytes(type), out.data() + b * block_elements(type));
  }
  return out;
}

std::vector<std::byte> random_weights(WeightType type, std::size_t rows, std::size_t k, std::uint64_t seed) {
  std::vector<std::byte> out(rows * row_bytes(type, k));
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (std::size_t i = 0; i + 8 <= out.size(); i += 8) {
    std::uint64_t r = next();
    std::memcpy(out.data() + i, &r, 8);
  }
  auto small_half = [&] { return static_cast<std::uint16_t>(0x1800u | (next() & 0x83FFu)); };  // |x| ~ 1e-3
  std::size_t bb = block_bytes(type), blocks = out.size() / bb;
  for (std::size_t b = 0; b < blocks; ++b) {
    std::byte* p = out.data() + b * bb;
    switch (type) {
      case WeightType::f32: {
        float v = static_cast<float>(static_cast<std::int32_t>(next() >> 32)) * 4.6e-10f;
        std::memcpy(p, &v, 4);
        break;
      }
      case WeightType::f16: put16(p, small_half()); break;
      case WeightType::bf16: put16(p, static_cast<std::uint16_t>(0x3A00u | (next() & 0x80FFu))); break;
      case WeightType::q8_0:
      case WeightType::q4_0: put16(p, small_half()); break;
      case WeightType::q4_k:
        put16(p, small_half());
        put16(p + 2, small_half());
        break;
      default: throw std::invalid_argument("random_weights: " + std::string(weight_type_name(type)) + " is not written yet");
    }
  }
  return out;
}

}  // namespace mqlm::gpu
