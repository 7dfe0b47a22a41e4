// Inside mqlm_weight_formats: one block's encoder, decoder and randomizer per weight type, and the
// scale fitting the quantizers share. The public interface is gpu/weight_formats.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gpu/weight_formats.hpp"

namespace mqlm::gpu::blocks {

// xorshift64: random_weights fills gigabytes with it, so it must be cheap, not good.
class RandomBits {
 public:
  explicit RandomBits(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return state_;
  }
  // A normal half of either sign with this biased exponent (1..30) and a random mantissa:
  // 1 is 6.1e-5..1.2e-4, each step up doubles it.
  std::uint16_t half(unsigned exponent) {
    return static_cast<std::uint16_t>(((exponent & 31u) << 10) | (next() & 0x83FFu));
  }

 private:
  std::uint64_t state_;
};

// Reads one block of block_elements(type) values from block_bytes(type) bytes and back;
// randomize sets the scale fields of a block of random bytes so that its values are small.
struct BlockCodec {
  void (*quantize)(const float* x, std::byte* out);
  void (*dequantize)(const std::byte* in, float* x);
  void (*randomize)(std::byte* block, RandomBits& bits);
};
const BlockCodec& small_block_codec(WeightType type);  // q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl
const BlockCodec& k_quant_codec(WeightType type);      // q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs

inline void put16(std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); }
inline std::uint16_t get16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline std::uint8_t u8(const std::byte* p, std::size_t i) { return std::to_integer<std::uint8_t>(p[i]); }
inline float get_half(const std::byte* p) { return half_to_float(get16(p)); }
// Stores value as a half at p and returns what the half reads back as: quantize with that.
inline float put_half(std::byte* p, float value) {
  put16(p, float_to_half(value));
  return get_half(p);
}

// x ~ scale * q for integers q in [qmin, qmax], qmin < 0 < qmax: the least-squares scale over a
// few candidate ranges (the extreme element at qmin, clipped a little, or at qmax). 0 when x is.
float fit_symmetric_scale(std::span<const float> x, int qmin, int qmax);
// x ~ scale * q + offset for q in [0, qmax], scale >= 0; offset <= 0 where the format stores it
// as a subtracted unsigned min (the K-quants). At most 32 values.
struct AffineFit {
  float scale;
  float offset;
};
AffineFit fit_affine(std::span<const float> x, int qmax, bool offset_at_most_zero);
// x ~ scale * kIq4Levels[index]: the best scale over candidate ranges for the non-linear levels.
float fit_iq4_scale(std::span<const float> x);
inline constexpr std::int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
int nearest_iq4_level(float value);  // the index into kIq4Levels

// round(value / scale) clamped to [qmin, qmax]; 0 (clamped) where scale is 0.
int round_to_level(float value, float scale, int qmin, int qmax);

}  // namespace mqlm::gpu::blocks
