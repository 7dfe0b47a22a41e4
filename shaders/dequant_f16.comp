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
#define IQ4_FLOAT_LEVELS
#include "quant_units.glsl"

#if defined(QUNIT)
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
  init_iq4_float_levels();
#endif
  if (u < blocks) {
    uvec4 pieces[4];
    block32_f16(0, u, p.K, pieces);  // rows are whole blocks: block u is block u of "row 0", no division
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
