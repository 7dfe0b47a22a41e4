#version 450
// out(M, K) F16 = the weights (M, K) in their GGUF layout, rows of whole blocks: what a wide product
// multiplies by as F16 weights, when dequantizing the matrix once is cheaper than in every column
// tile (gpu/ops.hpp, matmul_narrow), and the only way the tensor cores take the types of
// quant_units.glsl. One invocation per half block (16 weights) of Q4_0 and Q8_0, per block of 32
// weights of the others.
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "dequant_f16.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint M; uint K; } p;
layout(binding = 1) writeonly buffer Out { uvec4 out4[]; };  // F16, 8 to a word
#define QW_BINDING 0
#include "quant_units.glsl"

#if defined(QUNIT)
#if defined(A_IQ4_NL) || defined(A_IQ4_XS)
// The 16 levels as floats: a weight is a shared load and one multiplication, d * level exactly in
// F32 (at most 11 + 6 + 7 significant bits) and rounded once to F16, as the CPU reference does.
// Lanes looking up different levels read different banks.
shared float iq4_level_floats[16];

// Weights 8i .. 8i + 7 of a block as F16: nibble `hi` of the eight bytes w, times d.
uvec4 iq4_f16x8(uvec2 w, uint hi, float d) {
  uint h[4];
  [[unroll]] for (uint j = 0; j < 2; ++j) {
    // Four nibbles at once, each times 4: the extracted byte is the table's byte offset.
    const uint n4 = ((hi == 0u ? w[j] << 2 : w[j] >> 2)) & 0x3C3C3C3Cu;
    const vec4 level = vec4(iq4_level_floats[(n4 & 0xFFu) >> 2], iq4_level_floats[bitfieldExtract(n4, 8, 8) >> 2],
                            iq4_level_floats[bitfieldExtract(n4, 16, 8) >> 2], iq4_level_floats[n4 >> 26]);
    h[2 * j] = packHalf2x16(d * level.xy);
    h[2 * j + 1] = packHalf2x16(d * level.zw);
  }
  return uvec4(h[0], h[1], h[2], h[3]);
}
#endif

// Block u of the matrix as F16, piece i its weights 8i .. 8i + 7. Rows are whole blocks, so block
// u is block u of "row 0" (no division by the blocks a row).
void dequant_block(uint u, out uvec4 pieces[4]) {
#if defined(A_IQ4_NL) || defined(A_IQ4_XS)
  float d;
  const uvec4 w = iq4_quants16(iq4_block(0, u, p.K, d));
  pieces[0] = iq4_f16x8(w.xy, 0, d);  // elements 0..15: the low nibbles, 16..31 the high ones
  pieces[1] = iq4_f16x8(w.zw, 0, d);
  pieces[2] = iq4_f16x8(w.xy, 1, d);
  pieces[3] = iq4_f16x8(w.zw, 1, d);
#else
  block32_f16(0, u, p.K, pieces);
#endif
}

// The workgroup's 256 blocks of F16 (16 KiB) pass through shared memory on their way out: a lane's
// block is 64 contiguous bytes, so its four stores sat at a 64-byte stride across lanes (every
// store instruction half of 32 sectors); read back across lanes, each store instruction writes 512
// contiguous bytes. Piece i of block b sits in slot 4 b + (i ^ ((b >> 1) & 3)): the eight lanes of
// each 128-byte phase of a 16-byte access then use different banks, writing and reading.
shared uvec4 staged_pieces[256 * 4];
uint staged_slot(uint b, uint i) { return 4 * b + (i ^ ((b >> 1) & 3u)); }

void main() {
  const uint lane = gl_LocalInvocationIndex, u = flat_group() * 256 + lane, blocks = p.M * (p.K / 32);
#if defined(A_IQ4_NL) || defined(A_IQ4_XS)
  if (lane < 16) iq4_level_floats[lane] = float(int(iq4_level(lane) << 24) >> 24);
  barrier();
#endif
  if (u < blocks) {
    uvec4 pieces[4];
    dequant_block(u, pieces);
    [[unroll]] for (uint i = 0; i < 4; ++i) staged_pieces[staged_slot(lane, i)] = pieces[i];
  }
  barrier();
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uint piece = lane + 256 * i;  // of the workgroup's 1024, four a block
    if (flat_group() * 256 + piece / 4 < blocks) {
      out4[flat_group() * 1024 + piece] = staged_pieces[staged_slot(piece / 4, piece % 4)];
    }
  }
}
#else
layout(binding = 0) readonly buffer W { uint16_t w16[]; };

void main() {
  const uint u = flat_group() * 256 + gl_LocalInvocationIndex;
  const uint blocks = p.K / 32;
  if (u >= p.M * blocks * 2) return;
  const uint block = u / 2, half_ = u % 2;  // block = row * blocks + b: rows are whole blocks
  const uint word = 4 * block;              // the block's first 16-byte word of F16 output
#if defined(A_Q4_0)
  const uint h = 9 * block;
  const float16_t d = uint16BitsToFloat16(w16[h]);
  const uint q = h + 1 + 4 * half_;
  uvec4 lo, hi;
  q4_0_half_to_f16(d, uint(w16[q]) | (uint(w16[q + 1]) << 16), uint(w16[q + 2]) | (uint(w16[q + 3]) << 16), lo, hi);
  out4[word + half_] = lo;
  out4[word + 2 + half_] = hi;
#else
  const uint h = 17 * block;
  const float16_t d = uint16BitsToFloat16(w16[h]);
  uint v[8];
  [[unroll]] for (uint i = 0; i < 8; ++i) v[i] = q8_0_pair_to_f16(d, uint(w16[h + 1 + 8 * half_ + i]));
  out4[word + 2 * half_] = uvec4(v[0], v[1], v[2], v[3]);
  out4[word + 2 * half_ + 1] = uvec4(v[4], v[5], v[6], v[7]);
#endif
}
#endif
