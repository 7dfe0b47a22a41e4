#version 450
// One sequence's feed-forward block in one dispatch: a decode step of one token with Q4_0 or Q8_0
// weights (A_Q4_0 / A_Q8_0, the same type for gate, up and down):
//   x += down . (silu(gate . a) * (up . a)),  a = rmsnorm(x) * norm weight
// with the activations of both products as int8 blocks of 32, rounded as quantize_q8.comp rounds
// them (int8_blocks.glsl). The separate path takes five dispatches for this (norm and quantize, gate
// and up side by side, silu and quantize, down) with a barrier before each; the small ones and the barriers cost a
// single sequence more than their work (bench/results/dependent-dispatches-2026-11-27-h100.md).
//
// The grid is persistent (decode_grid.glsl): as many workgroups as the device has SMs
// (ops::ffn_decode), all resident at once, which work through two phases with a grid barrier
// (sync word push.sync_slot) between them:
//   1. each workgroup normalises and quantizes x into shared memory itself (x is a few KiB, in L2),
//      then takes its share of the rows of gate and up: h[r] = silu(gate[r] . a) * (up[r] . a);
//   2. after the barrier, each workgroup quantizes all of h into shared memory, then takes its
//      share of the rows of down: x[r] += down[r] . h.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint MAX_K = 16384;  // the longer of n_embd and n_ff, rounded up to 32

layout(push_constant) uniform Params {
  uint n_embd;
  uint n_ff;
  float eps;
  uint chunks_up;    // items a row of gate and up splits into
  uint chunks_down;  // and a row of down
  uint sync_slot;
} p;

layout(binding = 0) readonly buffer WGate { uint16_t w_gate[]; };
layout(binding = 1) readonly buffer WUp { uint16_t w_up[]; };
layout(binding = 2) readonly buffer WDown { uint16_t w_down[]; };
layout(binding = 3) buffer X { float x[]; };
layout(binding = 3) buffer X4 { vec4 x4[]; };
layout(binding = 4) readonly buffer NormW { vec4 nw4[]; };
layout(binding = 5) coherent buffer H { float h[]; };  // n_ff: written in phase 1, read by all in 2
layout(binding = 5) coherent buffer H4 { vec4 h4[]; };
#define SYNC_BINDING 6

#include "decode_grid.glsl"
float gate_unit(uint row, uint u, uint K) UNIT_DOT(w_gate)
float up_unit(uint row, uint u, uint K) UNIT_DOT(w_up)
float down_unit(uint row, uint u, uint K) UNIT_DOT(w_down)
void put_glu(uint r, float g, float v) { h[r] = g / (1.0 + exp(-g)) * v; }
DEFINE_PAIR_PRODUCT(gate_up_product, gate_unit, up_unit, put_glu)
DEFINE_RESIDUAL_PRODUCT(down_product, down_unit)

void main() {
  // Phase 1: a = int8(rmsnorm(x) * norm weight), then h = silu(gate . a) * (up . a).
  put_normed(p.n_embd, p.eps);
  gate_up_product(p.n_ff, p.n_embd, p.chunks_up);
  grid_barrier(p.sync_slot);
  // Phase 2: x += down . int8(h).
  for (uint u = gl_LocalInvocationIndex; u < p.n_ff / 8; u += gl_WorkGroupSize.x) put_unit(u, h4[2 * u], h4[2 * u + 1]);
  barrier();
  down_product(p.n_embd, p.n_ff, p.chunks_down);
}
