// The 32-element block types: one or two halves of scale and 32 levels each. Element j and j + 16
// share byte j of qs (low and high nibble); Q5's fifth bits are the bits of qh, element e at bit e.
// Decoders compute in the order ggml's dequantize_row_* does, so that they agree bit for bit.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "gpu/weight_format_blocks.hpp"

namespace mqlm::gpu::blocks {
namespace {

// Stores 32 levels 0..15 (or 0..31 with the fifth bits at qh) as Q4/Q5 blocks do.
void pack_nibbles(const int* q, std::byte* qs, std::byte* qh) {
  std::uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<std::byte>((q[j] & 15) | ((q[j + 16] & 15) << 4));
    high |= static_cast<std::uint32_t>((q[j] >> 4) & 1) << j;
    high |= static_cast<std::uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  if (qh != nullptr) std::memcpy(qh, &high, 4);
}

// The 32 levels of a Q4/Q5 block: nibbles, plus 16 where the fifth bit is set.
void unpack_nibbles(const std::byte* qs, const std::byte* qh, int* q) {
  std::uint32_t high = 0;
  if (qh != nullptr) std::memcpy(&high, qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (u8(qs, j) & 15) | static_cast<int>(((high >> j) & 1) << 4);
    q[j + 16] = (u8(qs, j) >> 4) | static_cast<int>(((high >> (j + 16)) & 1) << 4);
  }
}

void quantize_q8_0(const float* x, std::byte* out) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  float d = put_half(out, amax / 127.0f);
  for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<std::byte>(static_cast<std::int8_t>(round_to_level(x[j], d, -127, 127)));
}

void dequantize_q8_0(const std::byte* in, float* x) {
  float d = get_half(in);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(static_cast<std::int8_t>(u8(in, 2 + j))) * d;
}

// Q4_0 and Q5_0: x = d * (q - 2^(bits-1)).
template <int Bits>
void quantize_symmetric_block(const float* x, std::byte* out) {
  constexpr int bias = 1 << (Bits - 1);
  float d = put_half(out, fit_symmetric_scale({x, 32}, -bias, bias - 1));
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = round_to_level(x[j], d, -bias, bias - 1) + bias;
  pack_nibbles(q, out + (Bits == 5 ? 6 : 2), Bits == 5 ? out + 2 : nullptr);
}

template <int Bits>
void dequantize_symmetric_block(const std::byte* in, float* x) {
  constexpr int bias = 1 << (Bits - 1);
  float d = get_half(in);
  int q[32];
  unpack_nibbles(in + (Bits == 5 ? 6 : 2), Bits == 5 ? in + 2 : nullptr, q);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(q[j] - bias) * d;
}

// Q4_1 and Q5_1: x = d * q + m.
template <int Bits>
void quantize_affine_block(const float* x, std::byte* out) {
  constexpr int qmax = (1 << Bits) - 1;
  AffineFit fit = fit_affine({x, 32}, qmax, false);
  float d = put_half(out, fit.scale), m = put_half(out + 2, fit.offset);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = round_to_level(x[j] - m, d, 0, qmax);
  pack_nibbles(q, out + (Bits == 5 ? 8 : 4), Bits == 5 ? out + 4 : nullptr);
}

template <int Bits>
void dequantize_affine_block(const std::byte* in, float* x) {
  float d = get_half(in), m = get_half(in + 2);
  int q[32];
  unpack_nibbles(in + (Bits == 5 ? 8 : 4), Bits == 5 ? in + 4 : nullptr, q);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(q[j]) * d + m;
}

void quantize_iq4_nl(const float* x, std::byte* out) {
  float d = put_half(out, fit_iq4_scale({x, 32}));
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = d == 0 ? 8 : nearest_iq4_level(x[j] / d);
  pack_nibbles(q, out + 2, nullptr);
}

void dequantize_iq4_nl(const std::byte* in, float* x) {
  float d = get_half(in);
  int q[32];
  unpack_nibbles(in + 2, nullptr, q);
  for (int j = 0; j < 32; ++j) x[j] = d * static_cast<float>(kIq4Levels[q[j]]);
}

// Scales for |x| ~ 1e-3..1e-2 whatever the levels: exponent 6 is 2e-3..4e-3, each step halves.
template <unsigned Exponent>
void randomize_d(std::byte* block, RandomBits& bits) {
  put16(block, bits.half(Exponent));
}
template <unsigned Exponent>
void randomize_d_and_m(std::byte* block, RandomBits& bits) {
  put16(block, bits.half(Exponent));
  put16(block + 2, bits.half(6));
}

}  // namespace

const BlockCodec& small_block_codec(WeightType type) {
  static constexpr BlockCodec q8_0{quantize_q8_0, dequantize_q8_0, randomize_d<6>};
  static constexpr BlockCodec q4_0{quantize_symmetric_block<4>, dequantize_symmetric_block<4>, randomize_d<6>};
  static constexpr BlockCodec q5_0{quantize_symmetric_block<5>, dequantize_symmetric_block<5>, randomize_d<4>};
  static constexpr BlockCodec q4_1{quantize_affine_block<4>, dequantize_affine_block<4>, randomize_d_and_m<5>};
  static constexpr BlockCodec q5_1{quantize_affine_block<5>, dequantize_affine_block<5>, randomize_d_and_m<4>};
  static constexpr BlockCodec iq4_nl{quantize_iq4_nl, dequantize_iq4_nl, randomize_d<2>};
  switch (type) {
    case WeightType::q8_0: return q8_0;
    case WeightType::q4_0: return q4_0;
    case WeightType::q5_0: return q5_0;
    case WeightType::q4_1: return q4_1;
    case WeightType::q5_1: return q5_1;
    case WeightType::iq4_nl: return iq4_nl;
    default: throw std::logic_error("small_block_codec: " + std::string(weight_type_name(type)) + " is not a 32-element type");
  }
}

}  // namespace mqlm::gpu::blocks
