#version 450
// A mixture of experts' product: out(pair, M) = weights[expert(pair)](M, K) x acts(row, K) for each
// (token, slot) pair of a step, the expert read from `experts` (pair = token * slots + slot), so
// that only the chosen experts' weights are read. The weights are every expert's (M, K) matrix one
// after another. Activations: the token's row (PER_SLOT 0: gate and up read the same normed x) or
// the pair's own (down reads its expert's silu(gate) * up). Each workgroup makes ROWS rows of one
// pair, its threads striding along K.
// B_Q8: the activations as quantize_q8 makes them (expert_acts.glsl).
#include "common.glsl"
#define A_BINDING 0
#include "weights.glsl"
#if defined(A_Q4_K)  // Q4_K a block of 32 at a time too (quant_units.glsl reads it)
#define QW_BINDING A_BINDING
#include "quant_units.glsl"
#endif

#define ROWS 4
layout(local_size_x = 64) in;
layout(push_constant) uniform Params { uint M; uint K; uint slots; uint per_slot; uint pair0; uint cols; } p;
#include "expert_acts.glsl"
layout(binding = 2) readonly buffer Experts { uint experts[]; };
layout(binding = 3) writeonly buffer Out { float out_data[]; };

shared float partials[ROWS * 64];

void main() {
  uint pair = p.pair0 + gl_WorkGroupID.y;
  uint row0 = gl_WorkGroupID.x * ROWS;
  uint tid = gl_LocalInvocationIndex;
  uint first = experts[pair] * p.M;  // the expert's first row
  uint act_row = p.per_slot != 0 ? pair : pair / p.slots;
  float acc[ROWS];
  for (uint r = 0; r < ROWS; ++r) acc[r] = 0.0;
#if defined(QW_BINDING)
  // The types of quant_units.glsl (and Q4_K) a block of 32 at a time, each decoded once (load_a4 decodes
  // one for every quad).
  for (uint blk = tid; blk < p.K / 32; blk += 64) {
    vec4 x[8];
    for (uint i = 0; i < 8; ++i) x[i] = load_b4(act_row, 8 * blk + i);
    for (uint r = 0; r < ROWS; ++r) {
      if (row0 + r >= p.M) break;
      uvec2 w[4];
      vec2 a, b;
      block32(first + row0 + r, blk, p.K, w, a, b);
      for (uint i = 0; i < 8; ++i) acc[r] += dot(block_weights4(w, a, b, i), x[i]);
    }
  }
#else
  uint quads = (p.K + 3) / 4;
  for (uint q = tid; q < quads; q += 64) {
    vec4 x = load_b4(act_row, q);
    for (uint r = 0; r < ROWS; ++r) {
      if (row0 + r < p.M) acc[r] += dot(load_a4(first + row0 + r, q, p.K), x);
    }
  }
#endif
  for (uint r = 0; r < ROWS; ++r) partials[r * 64 + tid] = acc[r];
  barrier();
  for (uint width = 32; width > 0; width /= 2) {
    if (tid < width) {
      for (uint r = 0; r < ROWS; ++r) partials[r * 64 + tid] += partials[r * 64 + tid + width];
    }
    barrier();
  }
  if (tid < ROWS && row0 + tid < p.M) out_data[pair * p.M + row0 + tid] = partials[tid * 64];
}
