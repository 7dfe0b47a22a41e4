// The block-quantized types read 32 weights at a time (a block of the int8 activations): small
// integers q (signed bytes, four to a word, in element order) and, for each half of 16, two floats
// with weight = a * q + b. That is what an int8 dot product with activations quantized in blocks of
// 32 needs (sum = xd * (a * dot(q, xq) + b * sum(xq)) for each half), and what dequantizing takes.
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
// A_Q6_K, A_IQ4_XS; with BLOCK32_Q4_0_Q8_0 also A_Q4_0 (32 in 18: d, qs[16]@2, x = d * nibble - 8 d)
// and A_Q8_0 (32 in 34: d, qs[32]@2, x = d * q), which the dense kernels read their own way. IQ4_SHARED_LEVELS (block32's levels, for the int8 products) and IQ4_FLOAT_LEVELS
// (block32_f16's) look IQ4's levels up in shared memory: every invocation then calls
// init_iq4_levels() or init_iq4_float_levels() first. No read reaches past the block it decodes: a
// 4-byte word that would (2-byte aligned data at the end of a buffer, whose range robust access
// checks whole) is read as halves.

#if defined(A_Q4_1) || defined(A_Q5_0) || defined(A_Q5_1) || defined(A_IQ4_NL) || defined(A_Q2_K) || \
    defined(A_Q3_K) || defined(A_Q4_K) || defined(A_Q5_K) || defined(A_Q6_K) || defined(A_IQ4_XS) || \
    (defined(BLOCK32_Q4_0_Q8_0) && (defined(A_Q4_0) || defined(A_Q8_0)))
#define QUNIT 1
#extension GL_EXT_control_flow_attributes : require

// The weights at binding `at` as words of 4, 2, 8 and 16 bytes: name_u32, name_u16, name_u64, name_u128.
#define QW_VIEWS(at, Block, name)                                                   \
  layout(binding = at) readonly buffer Block##Words { uint name##_u32[]; };         \
  layout(binding = at) readonly buffer Block##Halves { uint16_t name##_u16[]; };    \
  layout(binding = at) readonly buffer Block##Pairs { uvec2 name##_u64[]; };        \
  layout(binding = at) readonly buffer Block##Quads { uvec4 name##_u128[]; };
QW_VIEWS(QW_BINDING, Qw, qw)
#if defined(QW_UP_BINDING)
// A second matrix of the same type at binding QW_UP_BINDING (a SwiGLU's up beside its gate): every
// read below goes to it while qw_up is true. A kernel sets qw_up to a constant before each call, so
// that the compilers fold the choice away: one load a read, as with one matrix.
QW_VIEWS(QW_UP_BINDING, QwUp, qw_up)
bool qw_up = false;
#define QW_READ(array, i) (qw_up ? qw_up_##array[i] : qw_##array[i])
#else
#define QW_READ(array, i) qw_##array[i]
#endif

// The little-endian word at byte offset o (even): one load where o is a multiple of 4.
uint qw_word(uint o) {
  if ((o & 2u) == 0u) return QW_READ(u32, o >> 2);
  return uint(QW_READ(u16, o >> 1)) | (uint(QW_READ(u16, (o >> 1) + 1)) << 16);
}
// Byte o, from its aligned word: only inside 4-byte aligned blocks' headers.
uint qw_byte(uint o) { return (QW_READ(u32, o >> 2) >> (8 * (o & 3u))) & 0xFFu; }
float qw_half(uint o) { return unpackHalf2x16(uint(QW_READ(u16, o >> 1))).x; }

// Bits 0..3 of x at bit 0 of bytes 0..3.
uint spread4(uint x) { return (x & 1u) | ((x & 2u) << 7) | ((x & 4u) << 14) | ((x & 8u) << 21); }

// N consecutive words from byte offset o (even) of blocks that are only 2-byte aligned: N aligned
// loads, the low half of the next word, and a funnel shift, the same instructions whichever the
// alignment (a branch would split the lanes of a subgroup, whose neighbouring blocks alternate).
// The next word is read as its low half alone: where the run ends a buffer of 2 bytes past a
// multiple of 4, the whole word would reach past the buffer's range (zero under robust access).
#define QW_RUN(N)                                                                         \
  void qw_run##N(uint o, out uint w[N]) {                                                 \
    uint a[N + 1];                                                                        \
    [[unroll]] for (uint k = 0; k < N; ++k) a[k] = QW_READ(u32, (o >> 2) + k);            \
    a[N] = (o & 2u) == 0u ? 0u : uint(QW_READ(u16, 2 * ((o >> 2) + N)));                  \
    [[unroll]] for (uint k = 0; k < N; ++k)                                               \
      w[k] = (o & 2u) == 0u ? a[k] : ((a[k] >> 16) | (a[k + 1] << 16));                   \
  }
QW_RUN(4)
QW_RUN(8)

#if defined(A_IQ4_NL) || defined(A_IQ4_XS)
// IQ4_NL's 16 levels as signed bytes: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113,
// four to a word, picked by selects (a constant array indexed per lane goes through local memory).
uint iq4_level(uint n) {
  const uint word = n < 8u ? (n < 4u ? 0xBFAD9881u : 0xF6EADDCFu) : (n < 12u ? 0x26190D01u : 0x71594535u);
  return (word >> (8 * (n & 3u))) & 0xFFu;
}
#if defined(IQ4_SHARED_LEVELS)
// For the hot kernels: the 16 levels in shared memory, one word each so that they lie in 16
// different banks (lanes looking up different levels never wait on each other; a table of the 256
// byte values' level pairs did, and ran at half the speed of selects). init_iq4_levels() fills it;
// every invocation calls it.
shared uint iq4_levels_shared[16];
void init_iq4_levels() {
  if (gl_LocalInvocationIndex < 16) iq4_levels_shared[gl_LocalInvocationIndex] = iq4_level(gl_LocalInvocationIndex);
  barrier();
}
#endif
// 16 bytes of nibble pairs (element j the low nibble of byte j, element 16 + j the high one) as
// the 32 elements' levels.
void iq4_levels32(uvec4 w, out uvec2 q[4]) {
  uint lo[4], hi[4];
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    lo[i] = 0u;
    hi[i] = 0u;
    [[unroll]] for (uint k = 0; k < 4; ++k) {
      const uint byte_ = (w[i] >> (8 * k)) & 0xFFu;
#if defined(IQ4_SHARED_LEVELS)
      lo[i] |= iq4_levels_shared[byte_ & 15u] << (8 * k);
      hi[i] |= iq4_levels_shared[byte_ >> 4] << (8 * k);
#else
      lo[i] |= iq4_level(byte_ & 15u) << (8 * k);
      hi[i] |= iq4_level(byte_ >> 4) << (8 * k);
#endif
    }
  }
  q[0] = uvec2(lo[0], lo[1]);
  q[1] = uvec2(lo[2], lo[3]);
  q[2] = uvec2(hi[0], hi[1]);
  q[3] = uvec2(hi[2], hi[3]);
}

#if defined(IQ4_FLOAT_LEVELS)
// Block `blk` of 32 weights of row `row` (rows of K): the byte offset of its 16 bytes of nibble
// pairs (iq4_levels32's order) and its scale d: weight = d * level[nibble].
uint iq4_block(uint row, uint blk, uint K, out float d) {
#if defined(A_IQ4_NL)
  const uint o = 18 * (row * (K / 32) + blk);
  d = qw_half(o);
  return o + 2;
#else
  const uint o = 136 * (row * (K / 256) + blk / 8), s = blk % 8;
  const uvec2 header = QW_READ(u64, o / 8);  // d and scales_h; scales_l[4] (8-byte aligned: one load)
  const uint head = header.x, scales_l = header.y;
  // ls6: nibble s & 1 of byte s / 2 of scales_l, that is bits 4 s.., under bits 16 + 2 s.. of head
  const uint ls = ((scales_l >> (4 * s)) & 15u) | ((head >> (12 + 2 * s)) & 0x30u);
  // ls - 32 exactly, as float(ls) - 32.0 but without a conversion: 2^23 + ls - (2^23 + 32)
  d = unpackHalf2x16(head).x * (uintBitsToFloat(0x4B000000u | ls) - 8388640.0);
  return o + 8 + 16 * s;
#endif
}
// The 16 bytes of nibble pairs at byte offset o (iq4_block's).
uvec4 iq4_quants16(uint o) {
#if defined(A_IQ4_NL)
  uint r[4];
  qw_run4(o, r);
  return uvec4(r[0], r[1], r[2], r[3]);
#else
  return uvec4(QW_READ(u64, o / 8), QW_READ(u64, o / 8 + 1));  // IQ4_XS's blocks are 8-byte aligned
#endif
}
// For the kernels that dequantize to F16: the 16 levels as floats in shared memory, so that a
// weight is a shared load and one multiplication, d * level exactly in F32 (at most 11 + 6 + 7
// significant bits) and rounded once to F16, as the CPU reference does (the selects and an
// int-to-float conversion a weight otherwise). Lanes looking up different levels read different
// banks. init_iq4_float_levels() fills it; every invocation calls it.
shared float iq4_level_floats[16];
void init_iq4_float_levels() {
  for (uint i = gl_LocalInvocationIndex; i < 16; i += gl_WorkGroupSize.x) {
    iq4_level_floats[i] = float(int(iq4_level(i) << 24) >> 24);
  }
  barrier();
}
// Weights 8i .. 8i + 7 of a block as F16: nibble `hi` of the eight bytes w, times d.
uvec4 iq4_f16x8(uvec2 w, uint hi, float d) {
  uint h[4];
  [[unroll]] for (uint j = 0; j < 2; ++j) {
    // Four nibbles at once, each times 4: the extracted byte is the table's byte offset.
    const uint n4 = (hi == 0u ? w[j] << 2 : w[j] >> 2) & 0x3C3C3C3Cu;
    const vec4 level = vec4(iq4_level_floats[(n4 & 0xFFu) >> 2], iq4_level_floats[bitfieldExtract(n4, 8, 8) >> 2],
                            iq4_level_floats[bitfieldExtract(n4, 16, 8) >> 2], iq4_level_floats[n4 >> 26]);
    h[2 * j] = packHalf2x16(d * level.xy);
    h[2 * j + 1] = packHalf2x16(d * level.zw);
  }
  return uvec4(h[0], h[1], h[2], h[3]);
}
#endif
#endif

// Eight consecutive bytes at byte offset o (o a multiple of 2).
uvec2 qw_pair(uint o) { return uvec2(qw_word(o), qw_word(o + 4)); }
// Nibble `hi` (0 low, 1 high) of each of eight bytes.
uvec2 nibbles8(uvec2 w, uint hi) { return (w >> (4 * hi)) & 0x0F0F0F0Fu; }

#if defined(A_Q4_K) || defined(A_Q5_K)
// The 6-bit scale and min of sub-block s of a Q4_K / Q5_K super-block at byte o (scales[12] at o + 4:
// sub-blocks 0..3 in the low 6 bits of bytes s and s + 4; 4..7 in the nibbles of byte s + 4 and the
// top 2 bits of bytes s - 4 and s). Selects rather than a branch: the lanes of a subgroup take
// neighbouring sub-blocks, half of them each way (a dynamically indexed word of the header, the
// other way to it, was slower still).
void k_scale_min(uint o, uint s, out uint sc, out uint mn) {
  const uint x = qw_byte(o + 4 + s), y = qw_byte(o + 8 + s), z = qw_byte(o + 4 + (s & 3u));
  sc = s < 4u ? x & 63u : (y & 15u) | ((z >> 6) << 4);
  mn = s < 4u ? y & 63u : (y >> 4) | ((x >> 6) << 4);
}
#endif

// Block `blk` of 32 weights of row `row` (rows of K): elements 32 blk .. 32 blk + 31, in one
// sub-block of 32 or two of 16. q[i]: elements 8i .. 8i + 7 as bytes; weight = a[h] * q + b[h] for
// the elements of half h (0: the first 16).
void block32(uint row, uint blk, uint K, out uvec2 q[4], out vec2 a, out vec2 b) {
#if defined(A_Q8_0)
  const uint o = 34 * (row * (K / 32) + blk);
  uint r[8];
  qw_run8(o + 2, r);
  [[unroll]] for (uint i = 0; i < 4; ++i) q[i] = uvec2(r[2 * i], r[2 * i + 1]);
  a = vec2(qw_half(o));
  b = vec2(0.0);
#elif defined(A_Q4_0) || defined(A_Q4_1) || defined(A_Q5_0) || defined(A_Q5_1) || defined(A_IQ4_NL)
  const uint blk_id = row * (K / 32) + blk;
#if defined(A_Q4_1)
  const uint o = 20 * blk_id, qs = o + 4;
#elif defined(A_Q5_0)
  const uint o = 22 * blk_id, qs = o + 6, qh = o + 2;
#elif defined(A_Q5_1)
  const uint o = 24 * blk_id, qs = o + 8, qh = o + 4;
#else
  const uint o = 18 * blk_id, qs = o + 2;
#endif
  uint r[4];
  qw_run4(qs, r);
  const uvec4 w = uvec4(r[0], r[1], r[2], r[3]);
#if defined(A_IQ4_NL)
  iq4_levels32(w, q);
#else
  q[0] = nibbles8(w.xy, 0);  // elements 0..15: the low nibbles, 16..31 the high ones
  q[1] = nibbles8(w.zw, 0);
  q[2] = nibbles8(w.xy, 1);
  q[3] = nibbles8(w.zw, 1);
#endif
  const vec2 dm = unpackHalf2x16(qw_word(o));
#if defined(A_Q5_0) || defined(A_Q5_1)
  const uint h = qw_word(qh);
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uint h8 = (h >> (8 * i)) & 0xFFu;
    q[i] |= uvec2(spread4(h8 & 15u), spread4(h8 >> 4)) << 4;
  }
#endif
  a = vec2(dm.x);
#if defined(A_Q4_1) || defined(A_Q5_1)
  b = vec2(dm.y);
#elif defined(A_Q5_0)
  b = vec2(-16.0 * dm.x);
#elif defined(A_Q4_0)
  b = vec2(-8.0 * dm.x);
#else
  b = vec2(0.0);
#endif
#else  // super-blocks of 256: sub-block (or group of 32) s of super-block sb
  const uint sb = row * (K / 256) + blk / 8, s = blk % 8;
#if defined(A_Q2_K) || defined(A_Q3_K) || defined(A_Q6_K)
  const uint n = s / 4, j = s % 4;  // half n of 128, group j of 32 in it
#endif
#if defined(A_Q2_K)
  const uint o = 84 * sb;
  [[unroll]] for (uint i = 0; i < 4; ++i) q[i] = (qw_pair(o + 16 + 32 * n + 8 * i) >> (2 * j)) & 0x03030303u;
  const uint sc = qw_word(o + 8 * n + 2 * j) & 0xFFFFu;  // the two halves' scale bytes
  const vec2 dm = unpackHalf2x16(qw_word(o + 80));
  a = dm.x * vec2(sc & 15u, (sc >> 8) & 15u);
  b = -dm.y * vec2((sc >> 4) & 15u, sc >> 12);
#elif defined(A_Q3_K)
  const uint o = 110 * sb;
  uint hm[8], qs[8];
  qw_run8(o, hm);
  qw_run8(o + 32 + 32 * n, qs);
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uvec2 hb = (uvec2(hm[2 * i], hm[2 * i + 1]) >> (4 * n + j)) & 0x01010101u;
    q[i] = ((uvec2(qs[2 * i], qs[2 * i + 1]) >> (2 * j)) & 0x03030303u) | (hb << 2);
  }
  const uint is = 8 * n + 2 * j;  // and is + 1: even, so both take the same bytes' fields
  const uint lo = qw_word(o + 96 + (is % 8)) >> (4 * (is / 8)), hi = qw_word(o + 104 + (is % 4)) >> (2 * (is / 4));
  const uvec2 sc6 = uvec2((lo & 15u) | ((hi & 3u) << 4), ((lo >> 8) & 15u) | (((hi >> 8) & 3u) << 4));
  a = qw_half(o + 108) * (vec2(sc6) - 32.0);
  b = -4.0 * a;
#elif defined(A_Q4_K) || defined(A_Q5_K)
#if defined(A_Q4_K)
  const uint o = 144 * sb;
  const uvec4 w0 = QW_READ(u128, (o + 16 + 32 * (s / 2)) / 16), w1 = QW_READ(u128, (o + 32 + 32 * (s / 2)) / 16);
  q[0] = nibbles8(w0.xy, s & 1u);
  q[1] = nibbles8(w0.zw, s & 1u);
  q[2] = nibbles8(w1.xy, s & 1u);
  q[3] = nibbles8(w1.zw, s & 1u);
#else
  const uint o = 176 * sb;
  const uvec4 w0 = QW_READ(u128, (o + 48 + 32 * (s / 2)) / 16), w1 = QW_READ(u128, (o + 64 + 32 * (s / 2)) / 16);
  const uvec4 h0 = (QW_READ(u128, (o + 16) / 16) >> s) & 0x01010101u, h1 = (QW_READ(u128, (o + 32) / 16) >> s) & 0x01010101u;
  q[0] = nibbles8(w0.xy, s & 1u) | (h0.xy << 4);
  q[1] = nibbles8(w0.zw, s & 1u) | (h0.zw << 4);
  q[2] = nibbles8(w1.xy, s & 1u) | (h1.xy << 4);
  q[3] = nibbles8(w1.zw, s & 1u) | (h1.zw << 4);
#endif
  uint sc, mn;
  k_scale_min(o, s, sc, mn);
  const vec2 dm = unpackHalf2x16(QW_READ(u32, o / 4));
  a = vec2(dm.x * float(sc));
  b = vec2(-dm.y * float(mn));
#elif defined(A_Q6_K)
  const uint o = 210 * sb;
  uint ql[8], qh[8];
  qw_run8(o + 64 * n + 32 * (j & 1u), ql);
  qw_run8(o + 128 + 32 * n, qh);
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    q[i] = nibbles8(uvec2(ql[2 * i], ql[2 * i + 1]), j >> 1) |
           (((uvec2(qh[2 * i], qh[2 * i + 1]) >> (2 * j)) & 0x03030303u) << 4);
  }
  const uint sc = qw_word(o + 192 + 8 * n + 2 * j);  // two int8 scales in the low half
  a = qw_half(o + 208) * vec2(int(sc << 24) >> 24, int(sc << 16) >> 24);
  b = -32.0 * a;
#elif defined(A_IQ4_XS)
  // The block is 8-byte aligned (136 bytes): its header and its sub-block's quants in three 8-byte loads.
  const uint o = 17 * sb;
  const uvec2 head = QW_READ(u64, o);  // d, scales_h; scales_l[4]
  const uint ls = ((head.y >> (4 * s)) & 15u) | (((head.x >> (16 + 2 * s)) & 3u) << 4);
  const uvec2 q0 = QW_READ(u64, o + 1 + 2 * s), q1 = QW_READ(u64, o + 2 + 2 * s);
  iq4_levels32(uvec4(q0, q1), q);
  a = vec2(unpackHalf2x16(head.x).x * (float(ls) - 32.0));
  b = vec2(0.0);
#endif
#endif
}

// Weights 4v .. 4v + 3 of a block (q, a, b), v < 8.
vec4 block_weights4(uvec2 q[4], vec2 a, vec2 b, uint v) {
  const uvec2 pair = q[v / 2];
  const uint w = v % 2 == 0u ? pair.x : pair.y;
  return a[v / 4] * vec4(ivec4(uvec4(w) << uvec4(24, 16, 8, 0)) >> 24) + b[v / 4];
}

// Block `blk` of row `row` as 32 F16 in element order (four words of 8), each weight rounded once
// from F32 (what dequant_f16.comp writes).
void block32_f16(uint row, uint blk, uint K, out uvec4 w[4]) {
#if defined(IQ4_FLOAT_LEVELS) && (defined(A_IQ4_NL) || defined(A_IQ4_XS))
  float d;
  const uvec4 qs = iq4_quants16(iq4_block(row, blk, K, d));
  w[0] = iq4_f16x8(qs.xy, 0, d);  // elements 0..15: the low nibbles, 16..31 the high ones
  w[1] = iq4_f16x8(qs.zw, 0, d);
  w[2] = iq4_f16x8(qs.xy, 1, d);
  w[3] = iq4_f16x8(qs.zw, 1, d);
#else
  uvec2 q[4];
  vec2 a, b;
  block32(row, blk, K, q, a, b);
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const vec4 lo = block_weights4(q, a, b, 2 * i), hi = block_weights4(q, a, b, 2 * i + 1);
    w[i] = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
  }
#endif
}
#endif
