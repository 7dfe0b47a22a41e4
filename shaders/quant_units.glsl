// The block-quantized types read eight weights at a time: unit g of a row is its elements
// 8g .. 8g + 7, which in every one of these types lie in one sub-block (one scale, one min). A
// unit comes back as eight small integers q (signed bytes, four to a word, in element order) and
// two floats, weight = a * q + b: what an int8 dot product with activations quantized in blocks of
// 32 needs (sum = xd * (a * dot(q, xq) + b * sum(xq))), and what dequantizing takes.
// Layouts (ggml's, gpu/weight_formats.hpp; byte offsets in a block):
//   Q4_1   32 in 20:  d, m, qs[16]@4                       x = d * nibble + m
//   Q5_0   32 in 22:  d, qh[4]@2, qs[16]@6                  x = d * (nibble | bit << 4) - 16 d
//   Q5_1   32 in 24:  d, m, qh[4]@4, qs[16]@8               x = d * (nibble | bit << 4) + m
//   IQ4_NL 32 in 18:  d, qs[16]@2                           x = d * level[nibble]
//     (element j < 16: low nibble of qs[j], bit j of qh; element 16 + j: high nibble, bit 16 + j)
//   Q2_K  256 in 84:  scales[16], qs[64]@16, d@80, dmin@82  x = d * (sc & 15) * crumb - dmin * (sc >> 4)
//   Q3_K  256 in 110: hmask[32], qs[64]@32, scales[12]@96, d@108
//                                                           x = d * (sc6 - 32) * ((crumb | hbit << 2) - 4)
//     (halves of 128: element 128 n + 32 j + l is crumb j of qs[32 n + l], bit 4 n + j of hmask[l],
//      scale 8 n + 2 j + l / 16)
//   Q4_K  256 in 144: d, dmin, scales[12]@4, qs[128]@16     x = d * sc6 * nibble - dmin * mn6
//   Q5_K  256 in 176: d, dmin, scales[12]@4, qh[32]@16, qs[128]@48
//                                                           x = d * sc6 * (nibble | bit << 4) - dmin * mn6
//     (sub-block s of 32: nibble s & 1 of qs[32 (s / 2) + l], bit s of qh[l])
//   Q6_K  256 in 210: ql[128], qh[64]@128, scales[16]@192 (int8), d@208
//                                                           x = d * sc * ((nibble | crumb << 4) - 32)
//     (element 128 n + 32 j + l: nibble j / 2 of ql[64 n + 32 (j & 1) + l], crumb j of
//      qh[32 n + l], scale 8 n + 2 j + l / 16)
//   IQ4_XS 256 in 136: d, scales_h (u16)@2, scales_l[4]@4, qs[128]@8
//                                                           x = d * (ls6 - 32) * level[nibble]
//     (sub-block s: qs[16 s ..] as IQ4_NL's block; ls6 low 4 bits nibble s & 1 of scales_l[s / 2],
//      high 2 bits crumb s of scales_h)
// Define QW_BINDING and one of A_Q4_1, A_Q5_0, A_Q5_1, A_IQ4_NL, A_Q2_K, A_Q3_K, A_Q4_K, A_Q5_K,
// A_Q6_K, A_IQ4_XS. Buffers are whole 4-byte words (the pool rounds them to 256 bytes).

#if defined(A_Q4_1) || defined(A_Q5_0) || defined(A_Q5_1) || defined(A_IQ4_NL) || defined(A_Q2_K) || \
    defined(A_Q3_K) || defined(A_Q4_K) || defined(A_Q5_K) || defined(A_Q6_K) || defined(A_IQ4_XS)
#define QUNIT 1

layout(binding = QW_BINDING) readonly buffer QwWords { uint qw_u32[]; };
layout(binding = QW_BINDING) readonly buffer QwHalves { uint16_t qw_u16[]; };

// The little-endian word at byte offset o (even): one load where o is a multiple of 4.
uint qw_word(uint o) {
  if ((o & 2u) == 0u) return qw_u32[o >> 2];
  return uint(qw_u16[o >> 1]) | (uint(qw_u16[(o >> 1) + 1]) << 16);
}
uint qw_byte(uint o) { return (qw_u32[o >> 2] >> (8 * (o & 3u))) & 0xFFu; }
float qw_half(uint o) { return unpackHalf2x16(uint(qw_u16[o >> 1])).x; }

// Bits 0..3 of x at bit 0 of bytes 0..3.
uint spread4(uint x) { return (x & 1u) | ((x & 2u) << 7) | ((x & 4u) << 14) | ((x & 8u) << 21); }

// IQ4_NL's 16 levels as signed bytes: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113.
const uint IQ4_LEVELS[4] = uint[4](0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
uint iq4_level(uint n) { return (IQ4_LEVELS[n >> 2] >> (8 * (n & 3u))) & 0xFFu; }
// Four nibbles (bit 0 of each byte of n4 upward) to their four levels.
uint iq4_levels4(uint n4) {
  return iq4_level(n4 & 15u) | (iq4_level((n4 >> 8) & 15u) << 8) | (iq4_level((n4 >> 16) & 15u) << 16) |
         (iq4_level(n4 >> 24) << 24);
}

// Eight consecutive bytes at byte offset o (o a multiple of 2).
uvec2 qw_pair(uint o) { return uvec2(qw_word(o), qw_word(o + 4)); }
// Nibble `hi` (0 low, 1 high) of each of eight bytes.
uvec2 nibbles8(uvec2 w, uint hi) { return (w >> (4 * hi)) & 0x0F0F0F0Fu; }

#if defined(A_Q4_K) || defined(A_Q5_K)
// The 6-bit scale and min of sub-block s of a Q4_K / Q5_K super-block at byte o.
void k_scale_min(uint o, uint s, out uint sc, out uint mn) {
  if (s < 4) {
    sc = qw_byte(o + 4 + s) & 63u;
    mn = qw_byte(o + 8 + s) & 63u;
  } else {
    const uint hi = qw_byte(o + 8 + s);
    sc = (hi & 15u) | ((qw_byte(o + s) >> 6) << 4);
    mn = (hi >> 4) | ((qw_byte(o + 4 + s) >> 6) << 4);
  }
}
#endif

// Unit g of row `row` (rows of K elements): q, a and b with weight = a * q + b.
void unit8(uint row, uint g, uint K, out uvec2 q, out float a, out float b) {
#if defined(A_Q4_1) || defined(A_Q5_0) || defined(A_Q5_1) || defined(A_IQ4_NL)
  const uint blk = row * (K / 32) + g / 4, i = g % 4;  // quarter i: elements 8i ..
#if defined(A_Q4_1)
  const uint o = 20 * blk, qs = o + 4;
#elif defined(A_Q5_0)
  const uint o = 22 * blk, qs = o + 6, qh = o + 2;
#elif defined(A_Q5_1)
  const uint o = 24 * blk, qs = o + 8, qh = o + 4;
#else
  const uint o = 18 * blk, qs = o + 2;
#endif
  q = nibbles8(qw_pair(qs + 8 * (i & 1u)), i >> 1);
  const vec2 dm = unpackHalf2x16(qw_word(o));
  a = dm.x;
#if defined(A_Q5_0) || defined(A_Q5_1)
  const uint h = (qw_word(qh) >> (8 * i)) & 0xFFu;
  q |= uvec2(spread4(h & 15u), spread4(h >> 4)) << 4;
#endif
#if defined(A_Q4_1) || defined(A_Q5_1)
  b = dm.y;
#elif defined(A_Q5_0)
  b = -16.0 * dm.x;
#else
  q = uvec2(iq4_levels4(q.x), iq4_levels4(q.y));
  b = 0.0;
#endif
#else  // super-blocks of 256
  const uint sb = row * (K / 256) + g / 32, e = 8 * (g % 32);  // e: the unit's first element in it
#if defined(A_Q2_K) || defined(A_Q3_K) || defined(A_Q6_K)
  const uint n = e / 128, j = (e % 128) / 32, l = e % 32;
#endif
#if defined(A_Q2_K)
  const uint o = 84 * sb;
  q = (qw_pair(o + 16 + 32 * n + l) >> (2 * j)) & 0x03030303u;
  const uint sc = qw_byte(o + 8 * n + 2 * j + l / 16);
  const vec2 dm = unpackHalf2x16(qw_word(o + 80));
  a = dm.x * float(sc & 15u);
  b = -dm.y * float(sc >> 4);
#elif defined(A_Q3_K)
  const uint o = 110 * sb, is = 8 * n + 2 * j + l / 16;
  const uvec2 hb = (qw_pair(o + l) >> (4 * n + j)) & 0x01010101u;
  q = ((qw_pair(o + 32 + 32 * n + l) >> (2 * j)) & 0x03030303u) | (hb << 2);
  const uint sc6 = ((qw_byte(o + 96 + is % 8) >> (4 * (is / 8))) & 15u) |
                   (((qw_byte(o + 104 + is % 4) >> (2 * (is / 4))) & 3u) << 4);
  a = qw_half(o + 108) * (float(sc6) - 32.0);
  b = -4.0 * a;
#elif defined(A_Q4_K) || defined(A_Q5_K)
  const uint s = e / 32, l = e % 32;
#if defined(A_Q4_K)
  const uint o = 144 * sb;
  q = nibbles8(qw_pair(o + 16 + 32 * (s / 2) + l), s & 1u);
#else
  const uint o = 176 * sb;
  q = nibbles8(qw_pair(o + 48 + 32 * (s / 2) + l), s & 1u) | (((qw_pair(o + 16 + l) >> s) & 0x01010101u) << 4);
#endif
  uint sc, mn;
  k_scale_min(o, s, sc, mn);
  const vec2 dm = unpackHalf2x16(qw_u32[o / 4]);
  a = dm.x * float(sc);
  b = -dm.y * float(mn);
#elif defined(A_Q6_K)
  const uint o = 210 * sb;
  q = nibbles8(qw_pair(o + 64 * n + 32 * (j & 1u) + l), j >> 1) | (((qw_pair(o + 128 + 32 * n + l) >> (2 * j)) & 0x03030303u) << 4);
  const int sc = int(qw_byte(o + 192 + 8 * n + 2 * j + l / 16) << 24) >> 24;
  a = qw_half(o + 208) * float(sc);
  b = -32.0 * a;
#elif defined(A_IQ4_XS)
  const uint o = 136 * sb, s = e / 32, i = (e % 32) / 8;
  const uint head = qw_u32[o / 4];  // d, scales_h
  const uint ls = ((qw_byte(o + 4 + s / 2) >> (4 * (s & 1u))) & 15u) | (((head >> (16 + 2 * s)) & 3u) << 4);
  const uvec2 n4 = nibbles8(qw_pair(o + 8 + 16 * s + 8 * (i & 1u)), i >> 1);
  q = uvec2(iq4_levels4(n4.x), iq4_levels4(n4.y));
  a = unpackHalf2x16(head).x * (float(ls) - 32.0);
  b = 0.0;
#endif
#endif
}

// Weights 4h .. 4h + 3 of unit (q, a, b): h 0 or 1.
vec4 unit_weights4(uvec2 q, float a, float b, uint h) {
  const uint w = h == 0u ? q.x : q.y;
  return a * vec4(ivec4(uvec4(w) << uvec4(24, 16, 8, 0)) >> 24) + b;
}
#endif
