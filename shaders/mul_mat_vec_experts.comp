#version 450
// A mixture of experts' decode products on int8 activations (quantize_q8's): out(pair, M) =
// weights[expert(pair)](M, K) x acts(row, K) for each (token, slot) pair, pair = token * slots +
// slot, reading only the chosen experts' weights as whole blocks of 32 (quant_units.glsl's block32,
// Q4_0 and Q8_0 included) against the activations' int8 blocks, one integer dot product for four
// weights. The weights are every expert's (M, K) matrix one after another. Activations: the token's
// row (per_slot 0: gate and up read the same normed x) or the pair's own (down).
// SUM: the down product and the experts' weighted sum in one: x(token, M) += sum over the token's
// slots of weight(token, slot) * expert(slot)'s product, a workgroup making its rows for every slot
// and adding them in a fixed order (no atomics: the same bits every run).
// LANES threads share a row (a specialization constant): they take its (slot, block) items in turn,
// so that a row of few blocks (qwen3moe's down product: K 768, 24 blocks) still keeps the
// workgroup's threads busy; a workgroup makes 128 / LANES rows of one pair (of one token with SUM).
// Grid: (ceil(M / rows), pairs or tokens - pair0).
#include "common.glsl"
#include "int8_dot.glsl"
#define QW_BINDING 0
#define IQ4_SHARED_LEVELS
#define BLOCK32_Q4_0_Q8_0
#include "quant_units.glsl"
#if !defined(QUNIT)
#error "the int8 expert products read block-quantized weights"
#endif

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint LANES = 8;  // a power of two, at most 128
const uint ROWS = 128 / LANES;
layout(push_constant) uniform Params { uint M; uint K; uint slots; uint per_slot; uint pair0; uint cols; } p;
// The bytes of every activation row (p.cols of them), then one float scale a block of 32 from word
// p.cols * K / 4 (ops::q8_acts_bytes).
layout(binding = 1) readonly buffer ActsQuads { uvec4 x4[]; };
layout(binding = 1) readonly buffer ActsScales { float x_scale[]; };
layout(binding = 3) readonly buffer Experts { uint experts[]; };
#if defined(SUM)
layout(binding = 2) buffer X { float x[]; };
layout(binding = 4) readonly buffer Weights { float expert_weights[]; };  // (tokens, slots)
#else
layout(binding = 2) writeonly buffer Out { float out_data[]; };
#endif

shared float partials[128];

// Block u of activation row `act` against block u of weight row `row`: the product of the 32.
float block_product(uint row, uint act, uint u) {
  uvec2 q[4];
  vec2 a, b;
  block32(row, u, p.K, q, a, b);
  const uint at = act * (p.K / 16) + 2 * u;
  const uvec4 x0 = x4[at], x1 = x4[at + 1];
  const float d = x_scale[p.cols * (p.K / 4) + act * (p.K / 32) + u];
  const int dot0 = dot4x8(q[0].x, x0.x) + dot4x8(q[0].y, x0.y) + dot4x8(q[1].x, x0.z) + dot4x8(q[1].y, x0.w);
  const int dot1 = dot4x8(q[2].x, x1.x) + dot4x8(q[2].y, x1.y) + dot4x8(q[3].x, x1.z) + dot4x8(q[3].y, x1.w);
  const uint ones = 0x01010101u;  // the halves' sums of int8 values, what the weights' offsets b multiply
  const int sum0 = dot4x8(x0.x, ones) + dot4x8(x0.y, ones) + dot4x8(x0.z, ones) + dot4x8(x0.w, ones);
  const int sum1 = dot4x8(x1.x, ones) + dot4x8(x1.y, ones) + dot4x8(x1.z, ones) + dot4x8(x1.w, ones);
  return d * (a.x * float(dot0) + a.y * float(dot1) + b.x * float(sum0) + b.y * float(sum1));
}

void main() {
#if defined(A_IQ4_NL) || defined(A_IQ4_XS)
  init_iq4_levels();
#endif
  const uint tid = gl_LocalInvocationIndex, lane = tid % LANES, rows0 = gl_WorkGroupID.x * ROWS;
  const uint row = min(rows0 + tid / LANES, p.M - 1);  // rows past M read row M - 1 and are not written
  const uint group = p.pair0 + gl_WorkGroupID.y, blocks = p.K / 32;
  float acc = 0.0;
#if defined(SUM)
  // Item i of the row: block i % blocks of slot i / blocks; each slot's products weighted apart.
  for (uint i = lane; i < p.slots * blocks; i += LANES) {
    const uint slot = i / blocks, pair = group * p.slots + slot;
    acc += expert_weights[pair] * block_product(experts[pair] * p.M + row, pair, i - slot * blocks);
  }
#else
  const uint first = experts[group] * p.M, act = p.per_slot != 0 ? group : group / p.slots;
  for (uint u = lane; u < blocks; u += LANES) acc += block_product(first + row, act, u);
#endif
  partials[tid] = acc;
  barrier();
  if (lane != 0 || rows0 + tid / LANES >= p.M) return;
  float s = 0.0;
  for (uint i = 0; i < LANES; ++i) s += partials[tid + i];
#if defined(SUM)
  x[group * p.M + row] += s;
#else
  out_data[group * p.M + row] = s;
#endif
}
