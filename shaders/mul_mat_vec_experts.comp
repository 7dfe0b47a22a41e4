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
// GLU: gate (binding 0) and up (binding 4, the same type) of a pair in one workgroup, each thread's
// items in both, and silu(gate) * up of its 32 rows written as one int8 block (binding 2), what
// quantize_q8_silu makes of the two products' outputs, bit for bit: the down product's input in one
// dispatch where two products and quantize_q8_silu took two dispatch levels. M a multiple of 32.
// ROUTED (constant 1, GLU): each workgroup ranks its token's router logits (binding 3, (tokens,
// n_expert)) itself as moe_route does (moe_route.glsl), where it read moe_route's ids (binding 3),
// and the first of each pair writes the pair's expert and weight as moe_route would (bindings 5
// and 6) for SUM to read: no routing dispatch before the products.
// LANES threads share a row (a specialization constant): they take its (slot, block) items in turn,
// so that a row of few blocks (qwen3moe's down product: K 768, 24 blocks) still keeps the
// workgroup's threads busy; a workgroup makes 128 / LANES rows of one pair (of one token with SUM),
// or with GLU 32 rows in 32 * LANES threads (constant 2).
// Grid: (ceil(M / rows), pairs or tokens - pair0).
#include "common.glsl"
#include "int8_dot.glsl"
#define QW_BINDING 0
#if defined(GLU)
#define QW_UP_BINDING 4
#endif
#define IQ4_SHARED_LEVELS
#define BLOCK32_Q4_0_Q8_0
#include "quant_units.glsl"
#if !defined(QUNIT)
#error "the int8 expert products read block-quantized weights"
#endif

layout(constant_id = 0) const uint LANES = 8;  // a power of two, at most 128 (32 with GLU)
layout(constant_id = 1) const bool ROUTED = false;  // GLU
#if defined(GLU)
layout(local_size_x_id = 2) in;
const uint ROWS = 32;  // one int8 block of silu(gate) * up
#else
layout(local_size_x = 128) in;
const uint ROWS = 128 / LANES;
#endif
// n_expert: the router logits' row (ROUTED); pairs: the int8 output's columns (GLU).
layout(push_constant) uniform Params {
  uint M;
  uint K;
  uint slots;
  uint per_slot;
  uint pair0;
  uint cols;
  uint n_expert;
  uint pairs;
} p;
// The bytes of every activation row (p.cols of them), then one float scale a block of 32 from word
// p.cols * K / 4 (ops::q8_acts_bytes).
layout(binding = 1) readonly buffer ActsQuads { uvec4 x4[]; };
layout(binding = 1) readonly buffer ActsScales { float x_scale[]; };
layout(binding = 3) readonly buffer Experts { uint experts[]; };
#if defined(SUM)
layout(binding = 2) buffer X { float x[]; };
layout(binding = 4) readonly buffer Weights { float expert_weights[]; };  // (tokens, slots)
#elif defined(GLU)
#define INT8_BLOCKS_OUT 2
#include "int8_blocks.glsl"
#define ROUTE_LOGITS_BINDING 3
#include "moe_route.glsl"
layout(binding = 5) writeonly buffer PairExperts { uint pair_experts[]; };  // ROUTED: as moe_route writes them
layout(binding = 6) writeonly buffer PairWeights { float pair_weights[]; };
#else
layout(binding = 2) writeonly buffer Out { float out_data[]; };
#endif

// Block u of one activation row: its 32 int8 values, their scale and each half's sum of the bytes
// (what the weights' offsets b multiply).
struct BlockActs {
  uvec4 x0, x1;
  float d;
  int sum0, sum1;
};

BlockActs block_acts(uint act, uint u) {
  BlockActs x;
  const uint at = act * (p.K / 16) + 2 * u;
  x.x0 = x4[at];
  x.x1 = x4[at + 1];
  x.d = x_scale[p.cols * (p.K / 4) + act * (p.K / 32) + u];
  const uint ones = 0x01010101u;
  x.sum0 = dot4x8(x.x0.x, ones) + dot4x8(x.x0.y, ones) + dot4x8(x.x0.z, ones) + dot4x8(x.x0.w, ones);
  x.sum1 = dot4x8(x.x1.x, ones) + dot4x8(x.x1.y, ones) + dot4x8(x.x1.z, ones) + dot4x8(x.x1.w, ones);
  return x;
}

// A block of 32 weights (block32's q, a, b) against a block of activations: the product of the 32.
float block_dot(uvec2 q[4], vec2 a, vec2 b, BlockActs x) {
  const int dot0 = dot4x8(q[0].x, x.x0.x) + dot4x8(q[0].y, x.x0.y) + dot4x8(q[1].x, x.x0.z) + dot4x8(q[1].y, x.x0.w);
  const int dot1 = dot4x8(q[2].x, x.x1.x) + dot4x8(q[2].y, x.x1.y) + dot4x8(q[3].x, x.x1.z) + dot4x8(q[3].y, x.x1.w);
  return x.d * (a.x * float(dot0) + a.y * float(dot1) + b.x * float(x.sum0) + b.y * float(x.sum1));
}

// Block u of weight row `row` against block u of activation row `act`.
float block_product(uint row, uint act, uint u) {
  uvec2 q[4];
  vec2 a, b;
  block32(row, u, p.K, q, a, b);
  return block_dot(q, a, b, block_acts(act, u));
}

#if defined(GLU)
shared vec2 sums[gl_WorkGroupSize.x];  // each thread's share of its row's (gate, up)
shared float glu[ROWS];

// Rows rows0 .. rows0 + 31 of silu(gate) * up for `pair`: each thread's items of its row in gate and
// up (the activations read once for both), the row's sums in the order the plain product adds them,
// and the block's four units of 8 quantized by neighbouring lanes as quantize_q8_silu does.
void glu_block(uint pair, uint rows0) {
  const uint tid = gl_LocalInvocationIndex, lane = tid % LANES, r = tid / LANES, token = pair / p.slots;
  uint expert;
  if (ROUTED) {
    route_token(token, p.n_expert, p.slots);
    expert = route_experts[pair % p.slots];
    if (rows0 == 0 && tid == 0) {
      pair_experts[pair] = expert;
      pair_weights[pair] = route_weights[pair % p.slots];
    }
  } else {
    expert = experts[pair];
  }
  const uint row = expert * p.M + rows0 + r;
  vec2 acc = vec2(0.0);
  for (uint u = lane; u < p.K / 32; u += LANES) {
    uvec2 q[4], q_up[4];
    vec2 a, b, a_up, b_up;
    qw_up = false;
    block32(row, u, p.K, q, a, b);
    qw_up = true;
    block32(row, u, p.K, q_up, a_up, b_up);
    const BlockActs x = block_acts(token, u);
    acc += vec2(block_dot(q, a, b, x), block_dot(q_up, a_up, b_up, x));
  }
  sums[tid] = acc;
  barrier();
  if (lane == 0) {
    vec2 s = vec2(0.0);
    for (uint i = 0; i < LANES; ++i) s += sums[tid + i];
    glu[r] = s.x / (1.0 + exp(-s.x)) * s.y;
  }
  barrier();
  if (tid < 4) {
    const vec4 v0 = vec4(glu[8 * tid], glu[8 * tid + 1], glu[8 * tid + 2], glu[8 * tid + 3]);
    const vec4 v1 = vec4(glu[8 * tid + 4], glu[8 * tid + 5], glu[8 * tid + 6], glu[8 * tid + 7]);
    write_int8_unit(v0, v1, pair, p.pairs, p.M, rows0 / 8 + tid);
  }
}
#else
shared float partials[128];
#endif

void main() {
#if defined(A_IQ4_NL) || defined(A_IQ4_XS)
  init_iq4_levels();
#endif
#if defined(GLU)
  glu_block(p.pair0 + gl_WorkGroupID.y, gl_WorkGroupID.x * ROWS);
#else
  const uint tid = gl_LocalInvocationIndex, lane = tid % LANES, rows0 = gl_WorkGroupID.x * ROWS;
  const uint row = min(rows0 + tid / LANES, p.M - 1);  // rows past M read row M - 1 and are not written
  const uint group = p.pair0 + gl_WorkGroupID.y, blocks = p.K / 32;
  float acc = 0.0;
#if defined(SUM)
  // Item i of the row: block i % blocks of slot i / blocks; each slot's products weighted apart.
  for (uint i = lane; i < p.slots * blocks; i += LANES) {
    const uint slot = i / blocks, pair = group * p.slots + slot, u = i - slot * blocks;
    acc += expert_weights[pair] * block_product(experts[pair] * p.M + row, pair, u);
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
#endif
}
