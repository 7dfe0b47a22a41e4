// Weight matrices in GGUF layouts, read in place: row `row` of a (rows, K) matrix, K contiguous.
// load_a4(row, q, K) returns elements 4q .. 4q+3 of the row as floats (zeros past K for float
// types; quantized types require K to be a multiple of their block, as GGUF does).
// Define A_BINDING and exactly one of A_F32, A_F16, A_BF16, A_Q8_0, A_Q4_0, A_Q4_K or a type of
// quant_units.glsl (Q4_1 .. IQ4_XS), which reads those.

#if defined(A_F32)
layout(binding = A_BINDING) readonly buffer WeightsF32 { float a_f32[]; };
float a_elem(uint i) { return a_f32[i]; }
#elif defined(A_F16)
layout(binding = A_BINDING) readonly buffer WeightsF16 { float16_t a_f16[]; };
float a_elem(uint i) { return float(a_f16[i]); }
#elif defined(A_BF16)
layout(binding = A_BINDING) readonly buffer WeightsBF16 { uint16_t a_bf16[]; };
float a_elem(uint i) { return uintBitsToFloat(uint(a_bf16[i]) << 16); }
#else
layout(binding = A_BINDING) readonly buffer WeightsU16 { uint16_t a_u16[]; };
layout(binding = A_BINDING) readonly buffer WeightsU8 { uint8_t a_u8[]; };
layout(binding = A_BINDING) readonly buffer WeightsI8 { int8_t a_i8[]; };
float a_half(uint i16) { return unpackHalf2x16(uint(a_u16[i16])).x; }
#endif

#if defined(A_F32) || defined(A_F16) || defined(A_BF16)
vec4 load_a4(uint row, uint q, uint K) {
  uint k = 4 * q;
  uint base = row * K + k;
  if (k + 3 < K) return vec4(a_elem(base), a_elem(base + 1), a_elem(base + 2), a_elem(base + 3));
  vec4 v = vec4(0.0);
  for (uint j = 0; j < 4; ++j) {
    if (k + j < K) v[j] = a_elem(base + j);
  }
  return v;
}
#elif defined(A_Q8_0)
// block of 32: f16 d, int8 qs[32] (34 bytes); x = d * q
vec4 load_a4(uint row, uint q, uint K) {
  uint b = row * (K / 32) + q / 8;
  uint base = 34 * b + 2 + (q % 8) * 4;
  float d = a_half(17 * b);
  return d * vec4(a_i8[base], a_i8[base + 1], a_i8[base + 2], a_i8[base + 3]);
}
#elif defined(A_Q4_0)
// block of 32: f16 d, uint8 qs[16] (18 bytes); x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
vec4 load_a4(uint row, uint q, uint K) {
  uint b = row * (K / 32) + q / 8;
  uint j = (q % 8) * 4;
  float d = a_half(9 * b);
  uint base = 18 * b + 2 + (j & 15);
  uint shift = j < 16 ? 0 : 4;
  uvec4 n = (uvec4(a_u8[base], a_u8[base + 1], a_u8[base + 2], a_u8[base + 3]) >> shift) & 15u;
  return d * (vec4(n) - 8.0);
}
#elif defined(A_Q4_1) || defined(A_Q5_0) || defined(A_Q5_1) || defined(A_IQ4_NL) || defined(A_Q2_K) || \
    defined(A_Q3_K) || defined(A_Q5_K) || defined(A_Q6_K) || defined(A_IQ4_XS)
#define QW_BINDING A_BINDING
#include "quant_units.glsl"
vec4 load_a4(uint row, uint q, uint K) {
  uvec2 w;
  float a, b;
  unit8(row, q / 2, K, w, a, b);
  return unit_weights4(w, a, b, q % 2);
}
#elif defined(A_Q4_K)
// super-block of 256: f16 d, f16 dmin, uint8 scales[12] (eight 6-bit scales and mins), uint8 qs[128]
// (144 bytes). Sub-block s (32 values) uses nibble s & 1 of qs[32 * (s / 2) + l]:
// x = d * scale(s) * nibble - dmin * min(s).
vec4 load_a4(uint row, uint q, uint K) {
  uint sb = row * (K / 256) + q / 64;
  uint k = (q % 64) * 4;
  uint s = k / 32;
  uint byte0 = 144 * sb;
  uint sc, mn;
  if (s < 4) {
    sc = uint(a_u8[byte0 + 4 + s]) & 63u;
    mn = uint(a_u8[byte0 + 8 + s]) & 63u;
  } else {
    uint hi = uint(a_u8[byte0 + 8 + s]);
    sc = (hi & 15u) | ((uint(a_u8[byte0 + s]) >> 6) << 4);
    mn = (hi >> 4) | ((uint(a_u8[byte0 + 4 + s]) >> 6) << 4);
  }
  float d = a_half(72 * sb) * float(sc);
  float m = a_half(72 * sb + 1) * float(mn);
  uint base = byte0 + 16 + 32 * (s / 2) + (k % 32);
  uint shift = (s & 1) * 4;
  uvec4 n = (uvec4(a_u8[base], a_u8[base + 1], a_u8[base + 2], a_u8[base + 3]) >> shift) & 15u;
  return d * vec4(n) - m;
}
#endif
