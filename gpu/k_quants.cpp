// The 256-element super-block types: sub-blocks of 16 or 32 elements (sub-block s holds elements
// s * size ..), each with an integer scale (and min) under the block's half super-scale(s).
//   affine:  x = (d * sc[s]) * q - (dmin * mn[s]), q in [0, qmax]          Q2_K, Q4_K, Q5_K
//   signed:  x = (d * sc[s]) * level(q), sc[s] signed                       Q3_K, Q6_K, IQ4_XS
// Each type differs in where its bits lie; the element order is ggml's dequantize_row_*, and the
// decoders compute in its order, so that they agree bit for bit.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "gpu/weight_format_blocks.hpp"

namespace mqlm::gpu::blocks {
namespace {

void set_bits(std::byte* p, std::size_t at, int value, int shift) {
  p[at] |= static_cast<std::byte>(value << shift);
}
int get_bits(const std::byte* p, std::size_t at, int shift, int mask) { return (u8(p, at) >> shift) & mask; }

// --- Where each type keeps its levels. Q2_K, Q3_K and Q6_K walk halves of 128 elements in four
// groups of 32 (e = 128 h + 32 g + l) that share bytes; Q4_K and Q5_K pairs of 32 (e = 64 p + 32 s + l).

// Q2_K: scales[16] (scale | min << 4), qs[64], d, dmin.
void store_q2_k(std::byte* b, int e, int q) { set_bits(b, 16 + 32 * (e / 128) + e % 32, q, 2 * (e % 128 / 32)); }
int load_q2_k(const std::byte* b, int e) { return get_bits(b, 16 + 32 * (e / 128) + e % 32, 2 * (e % 128 / 32), 3); }

// Q3_K: hmask[32] (bit 4 h + g set where q >= 0), qs[64] (q & 3), scales[12] (sixteen 6-bit sc + 32), d.
void store_q3_k(std::byte* b, int e, int q) {
  int h = e / 128, g = e % 128 / 32, l = e % 32;
  set_bits(b, 32 + 32 * h + l, q & 3, 2 * g);
  set_bits(b, l, q >= 0 ? 1 : 0, 4 * h + g);
}
int load_q3_k(const std::byte* b, int e) {
  int h = e / 128, g = e % 128 / 32, l = e % 32;
  return get_bits(b, 32 + 32 * h + l, 2 * g, 3) - (get_bits(b, l, 4 * h + g, 1) ? 0 : 4);
}

// Q4_K: d, dmin, scales[12], qs[128].
void store_q4_k(std::byte* b, int e, int q) { set_bits(b, 16 + 32 * (e / 64) + e % 32, q, 4 * (e % 64 / 32)); }
int load_q4_k(const std::byte* b, int e) { return get_bits(b, 16 + 32 * (e / 64) + e % 32, 4 * (e % 64 / 32), 15); }

// Q5_K: d, dmin, scales[12], qh[32] (bit s: the fifth bit of sub-block s), qs[128].
void store_q5_k(std::byte* b, int e, int q) {
  set_bits(b, 48 + 32 * (e / 64) + e % 32, q & 15, 4 * (e % 64 / 32));
  set_bits(b, 16 + e % 32, q >> 4, e / 32);
}
int load_q5_k(const std::byte* b, int e) {
  return get_bits(b, 48 + 32 * (e / 64) + e % 32, 4 * (e % 64 / 32), 15) | (get_bits(b, 16 + e % 32, e / 32, 1) << 4);
}

// Q6_K: ql[128] (groups 0, 1 low nibbles, 2, 3 high), qh[64] (2 bits of each group), int8
// scales[16], d; q + 32 is stored.
void store_q6_k(std::byte* b, int e, int q) {
  int h = e / 128, g = e % 128 / 32, l = e % 32, u = q + 32;
  set_bits(b, 64 * h + 32 * (g & 1) + l, u & 15, 4 * (g >> 1));
  set_bits(b, 128 + 32 * h + l, u >> 4, 2 * g);
}
int load_q6_k(const std::byte* b, int e) {
  int h = e / 128, g = e % 128 / 32, l = e % 32;
  return (get_bits(b, 64 * h + 32 * (g & 1) + l, 4 * (g >> 1), 15) | (get_bits(b, 128 + 32 * h + l, 2 * g, 3) << 4)) - 32;
}

// IQ4_XS: d, scales_h (2 high bits of each sc + 32), scales_l[4] (4 low bits), qs[128]: sub-block
// s of 32 as an IQ4_NL block's nibbles, level indices.
void store_iq4_xs(std::byte* b, int e, int q) { set_bits(b, 8 + 16 * (e / 32) + e % 16, q, 4 * (e % 32 / 16)); }
int load_iq4_xs(const std::byte* b, int e) { return get_bits(b, 8 + 16 * (e / 32) + e % 16, 4 * (e % 32 / 16), 15); }

// --- Where each type keeps its sub-block scales (and mins).

void store_q2_k_scales(std::byte* b, const int* sc, const int* mn) {
  for (int s = 0; s < 16; ++s) b[s] = static_cast<std::byte>(sc[s] | (mn[s] << 4));
}
void load_q2_k_scales(const std::byte* b, int* sc, int* mn) {
  for (int s = 0; s < 16; ++s) {
    sc[s] = u8(b, s) & 15;
    mn[s] = u8(b, s) >> 4;
  }
}

// Q4_K and Q5_K: eight 6-bit scales and mins in 12 bytes at 4: sub-blocks 0-3 in the low 6 bits
// of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11 and the top 2 bits of 0-7.
void store_k4_scales(std::byte* b, const int* sc, const int* mn) {
  for (int j = 0; j < 4; ++j) {
    b[4 + j] = static_cast<std::byte>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b[8 + j] = static_cast<std::byte>(mn[j] | ((mn[j + 4] >> 4) << 6));
    b[12 + j] = static_cast<std::byte>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}
void load_k4_scales(const std::byte* b, int* sc, int* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = u8(b, 4 + j) & 63;
    mn[j] = u8(b, 8 + j) & 63;
    sc[j + 4] = (u8(b, 12 + j) & 15) | ((u8(b, 4 + j) >> 6) << 4);
    mn[j + 4] = (u8(b, 12 + j) >> 4) | ((u8(b, 8 + j) >> 6) << 4);
  }
}

// Q3_K: sixteen 6-bit values sc + 32 in 12 bytes at 96: low nibbles in bytes 0-7 (sub-blocks
// 0-7 low nibble, 8-15 high), 2 high bits in bytes 8-11 (sub-block s at bits 2 (s / 4)).
void store_q3_k_scales(std::byte* b, const int* sc) {
  for (int s = 0; s < 16; ++s) {
    set_bits(b, 96 + s % 8, (sc[s] + 32) & 15, 4 * (s / 8));
    set_bits(b, 104 + s % 4, (sc[s] + 32) >> 4, 2 * (s / 4));
  }
}
void load_q3_k_scales(const std::byte* b, int* sc) {
  for (int s = 0; s < 16; ++s) sc[s] = (get_bits(b, 96 + s % 8, 4 * (s / 8), 15) | (get_bits(b, 104 + s % 4, 2 * (s / 4), 3) << 4)) - 32;
}

void store_q6_k_scales(std::byte* b, const int* sc) {
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<std::byte>(static_cast<std::int8_t>(sc[s]));
}
void load_q6_k_scales(const std::byte* b, int* sc) {
  for (int s = 0; s < 16; ++s) sc[s] = static_cast<std::int8_t>(u8(b, 192 + s));
}

void store_iq4_xs_scales(std::byte* b, const int* sc) {
  std::uint16_t high = 0;
  for (int s = 0; s < 8; ++s) {
    set_bits(b, 4 + s / 2, (sc[s] + 32) & 15, 4 * (s % 2));
    high = static_cast<std::uint16_t>(high | (((sc[s] + 32) >> 4) << (2 * s)));
  }
  put16(b + 2, high);
}
void load_iq4_xs_scales(const std::byte* b, int* sc) {
  std::uint16_t high = get16(b + 2);
  for (int s = 0; s < 8; ++s) sc[s] = (get_bits(b, 4 + s / 2, 4 * (s % 2), 15) | (((high >> (2 * s)) & 3) << 4)) - 32;
}

// --- The two families, generic over the layouts above.

struct AffineLayout {
  std::size_t bytes;
  int sub_size, qmax, scale_max;
  std::size_t d_at;  // dmin follows d
  void (*store_scales)(std::byte*, const int* sc, const int* mn);
  void (*load_scales)(const std::byte*, int* sc, int* mn);
  void (*store)(std::byte*, int e, int q);
  int (*load)(const std::byte*, int e);
};

template <const AffineLayout& L>
void quantize_affine(const float* x, std::byte* out) {
  constexpr int subs = 256 / L.sub_size;
  AffineFit fits[subs];
  float max_scale = 0, max_min = 0;
  for (int s = 0; s < subs; ++s) {
    fits[s] = fit_affine({x + s * L.sub_size, static_cast<std::size_t>(L.sub_size)}, L.qmax, true);
    max_scale = std::max(max_scale, fits[s].scale);
    max_min = std::max(max_min, -fits[s].offset);
  }
  std::fill(out, out + L.bytes, std::byte{0});  // the stores OR their bits in
  float d = put_half(out + L.d_at, max_scale / L.scale_max), dmin = put_half(out + L.d_at + 2, max_min / L.scale_max);
  int sc[subs], mn[subs];
  for (int s = 0; s < subs; ++s) {
    sc[s] = round_to_level(fits[s].scale, d, 0, L.scale_max);
    mn[s] = round_to_level(-fits[s].offset, dmin, 0, L.scale_max);
  }
  L.store_scales(out, sc, mn);
  for (int e = 0; e < 256; ++e) {
    int s = e / L.sub_size;
    L.store(out, e, round_to_level(x[e] + dmin * static_cast<float>(mn[s]), d * static_cast<float>(sc[s]), 0, L.qmax));
  }
}

template <const AffineLayout& L>
void dequantize_affine(const std::byte* in, float* x) {
  constexpr int subs = 256 / L.sub_size;
  float d = get_half(in + L.d_at), dmin = get_half(in + L.d_at + 2);
  int sc[subs], mn[subs];
  L.load_scales(in, sc, mn);
  for (int s = 0; s < subs; ++s) {
    float step = d * static_cast<float>(sc[s]), offset = dmin * static_cast<float>(mn[s]);
    for (int e = s * L.sub_size; e < (s + 1) * L.sub_size; ++e) x[e] = step * static_cast<float>(L.load(in, e)) - offset;
  }
}

// Signed scales: the sub-block scale of largest magnitude lands on scale_min, the longer end.
struct SignedLayout {
  std::size_t bytes;
  int sub_size, scale_min, scale_max;
  std::size_t d_at;
  float (*fit_scale)(std::span<const float> x);
  int (*choose)(float x, float step);  // the stored level nearest x
  float (*value)(int level);           // what a stored level means
  void (*store_scales)(std::byte*, const int* sc);
  void (*load_scales)(const std::byte*, int* sc);
  void (*store)(std::byte*, int e, int level);
  int (*load)(const std::byte*, int e);
};

template <const SignedLayout& L>
void quantize_signed(const float* x, std::byte* out) {
  constexpr int subs = 256 / L.sub_size;
  float scales[subs], extreme = 0;
  for (int s = 0; s < subs; ++s) {
    scales[s] = L.fit_scale({x + s * L.sub_size, static_cast<std::size_t>(L.sub_size)});
    if (std::fabs(scales[s]) > std::fabs(extreme)) extreme = scales[s];
  }
  std::fill(out, out + L.bytes, std::byte{0});  // the stores OR their bits in
  float d = put_half(out + L.d_at, extreme / static_cast<float>(L.scale_min));
  int sc[subs];
  for (int s = 0; s < subs; ++s) sc[s] = round_to_level(scales[s], d, L.scale_min, L.scale_max);
  L.store_scales(out, sc);
  for (int e = 0; e < 256; ++e) L.store(out, e, L.choose(x[e], d * static_cast<float>(sc[e / L.sub_size])));
}

template <const SignedLayout& L>
void dequantize_signed(const std::byte* in, float* x) {
  constexpr int subs = 256 / L.sub_size;
  float d = get_half(in + L.d_at);
  int sc[subs];
  L.load_scales(in, sc);
  for (int s = 0; s < subs; ++s) {
    float step = d * static_cast<float>(sc[s]);
    for (int e = s * L.sub_size; e < (s + 1) * L.sub_size; ++e) x[e] = step * L.value(L.load(in, e));
  }
}

float fit_q3_k_scale(std::span<const float> x) { return fit_symmetric_scale(x, -4, 3); }
float fit_q6_k_scale(std::span<const float> x) { return fit_symmetric_scale(x, -32, 31); }
int choose_q3_k(float x, float step) { return round_to_level(x, step, -4, 3); }
int choose_q6_k(float x, float step) { return round_to_level(x, step, -32, 31); }
int choose_iq4(float x, float step) { return step == 0 ? 8 : nearest_iq4_level(x / step); }
float integer_value(int level) { return static_cast<float>(level); }
float iq4_value(int level) { return static_cast<float>(kIq4Levels[level]); }

constexpr AffineLayout q2_k{84, 16, 3, 15, 80, store_q2_k_scales, load_q2_k_scales, store_q2_k, load_q2_k};
constexpr AffineLayout q4_k{144, 32, 15, 63, 0, store_k4_scales, load_k4_scales, store_q4_k, load_q4_k};
constexpr AffineLayout q5_k{176, 32, 31, 63, 0, store_k4_scales, load_k4_scales, store_q5_k, load_q5_k};
constexpr SignedLayout q3_k{110, 16, -32, 31, 108, fit_q3_k_scale, choose_q3_k, integer_value,
                            store_q3_k_scales, load_q3_k_scales, store_q3_k, load_q3_k};
constexpr SignedLayout q6_k{210, 16, -128, 127, 208, fit_q6_k_scale, choose_q6_k, integer_value,
                            store_q6_k_scales, load_q6_k_scales, store_q6_k, load_q6_k};
constexpr SignedLayout iq4_xs{136, 32, -32, 31, 0, fit_iq4_scale, choose_iq4, iq4_value,
                              store_iq4_xs_scales, load_iq4_xs_scales, store_iq4_xs, load_iq4_xs};

// Random levels with scales for |x| ~ 1e-3..1e-2: super-scales of 6e-5..5e-4 (exponents 1-4),
// and where levels times scales still reach past that, sub-block scales capped at 15.
void randomize_q2_k(std::byte* b, RandomBits& bits) {
  put16(b + 80, bits.half(4));
  put16(b + 82, bits.half(2));
}
void randomize_q3_k(std::byte* b, RandomBits& bits) { put16(b + 108, bits.half(2)); }
void randomize_q4_k(std::byte* b, RandomBits& bits) {
  put16(b, bits.half(6));  // the scales Q4_K always had (|x| up to 3.4): kernel tests are tuned to them
  put16(b + 2, bits.half(6));
}
void randomize_q5_k(std::byte* b, RandomBits& bits) {
  for (int j = 4; j < 12; ++j) b[j] &= std::byte{0x0F};  // every scale and min 0..15
  put16(b, bits.half(1));
  put16(b + 2, bits.half(1));
}
void randomize_q6_k(std::byte* b, RandomBits& bits) {
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<std::byte>(static_cast<std::int8_t>(static_cast<int>(bits.next() & 15) - 8));
  put16(b + 208, bits.half(2));
}
void randomize_iq4_xs(std::byte* b, RandomBits& bits) {
  for (int j = 4; j < 8; ++j) b[j] &= std::byte{0x33};  // sc + 32 in 32..35: sc 0..3
  put16(b + 2, 0xAAAA);
  put16(b, bits.half(1));
}

}  // namespace

const BlockCodec& k_quant_codec(WeightType type) {
  static constexpr BlockCodec codecs[] = {
      {quantize_affine<q2_k>, dequantize_affine<q2_k>, randomize_q2_k},
      {quantize_signed<q3_k>, dequantize_signed<q3_k>, randomize_q3_k},
      {quantize_affine<q4_k>, dequantize_affine<q4_k>, randomize_q4_k},
      {quantize_affine<q5_k>, dequantize_affine<q5_k>, randomize_q5_k},
      {quantize_signed<q6_k>, dequantize_signed<q6_k>, randomize_q6_k},
      {quantize_signed<iq4_xs>, dequantize_signed<iq4_xs>, randomize_iq4_xs}};
  switch (type) {
    case WeightType::q2_k: return codecs[0];
    case WeightType::q3_k: return codecs[1];
    case WeightType::q4_k: return codecs[2];
    case WeightType::q5_k: return codecs[3];
    case WeightType::q6_k: return codecs[4];
    case WeightType::iq4_xs: return codecs[5];
    default: throw std::logic_error("k_quant_codec: " + std::string(weight_type_name(type)) + " is not a 256-element type");
  }
}

}  // namespace mqlm::gpu::blocks
