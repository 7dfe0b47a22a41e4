#version 450
// One sequence's feed-forward block in one dispatch: a decode step of one token with Q4_0 or Q8_0
// weights (A_Q4_0 / A_Q8_0, the same type for gate, up and down):
//   x += down . (silu(gate . a) * (up . a)),  a = rmsnorm(x) * norm weight
// with the activations of both products as int8 blocks of 32, rounded as quantize_q8.comp rounds
// them (int8_blocks.glsl). The separate path takes six dispatches for this (norm and quantize, gate
// and up, silu and quantize, down) with a barrier before each; the small ones and the barriers cost a
// single sequence more than their work (bench/results/dependent-dispatches-2026-11-27-h100.md).
//
// The grid is persistent: as many workgroups as the device has SMs (ops::ffn_decode), all resident
// at once, which work through two phases with a grid barrier between them:
//   1. each workgroup normalises and quantizes x into shared memory itself (x is a few KiB, in L2),
//      then takes its share of the rows of gate and up: h[r] = silu(gate[r] . a) * (up[r] . a);
//   2. after the barrier, each workgroup quantizes all of h into shared memory, then takes its
//      share of the rows of down: x[r] += down[r] . h.
// A subgroup takes one chunk of K of one row at a time (an item, see item_of) and sums it with
// subgroupAdd; the chunks of a row meet in shared memory. push.chunks_* divide K's units (8 weights
// each) and the workgroup's subgroups.
//
// Grid barrier: the host zeroes the step's counters (push.sync_slot, one for each layer) before
// the first layer. A workgroup that waits too long (workgroups not resident together: another
// device, or another process's work on this one) gives up, counts the failure in counter 0, which
// the host checks after the step, and goes on, rather than hanging the GPU.
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#include "int8_blocks.glsl"
#include "int8_dot.glsl"
#include "reduce.glsl"

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
layout(binding = 6) coherent buffer Sync { uint sync[]; };

// A wait lasts what the slowest workgroup's share of gate and up takes (tens of us); 2^18 polls
// (~0.1 s on the H100) is far past that, and short enough that a grid that cannot be resident
// fails its step in seconds rather than minutes.
const uint SYNC_SPINS = 1u << 18;
const uint UNROLL = 4;  // units a lane loads before it sums them (2 and 8: no faster on the H100)
const uint ROUND = 256;  // items whose partial sums shared memory holds at once

shared uint act_words[MAX_K / 4];    // the int8 activations, four to a word, in element order
shared float act_scale[MAX_K / 32];  // one scale a block of 32
shared float part_a[ROUND];
shared float part_b[ROUND];

// Elements 8u .. 8u + 7 (v0, v1) into shared memory as int8. The four threads of a block must be
// neighbouring lanes, all active (int8_blocks.glsl): units go to threads in order, K a multiple of 32.
void put_unit(uint u, vec4 v0, vec4 v1) {
  const float amax = block_amax(v0, v1);
  const uvec2 bytes = block_bytes(v0, v1, amax);
  act_words[2 * u] = bytes.x;
  act_words[2 * u + 1] = bytes.y;
  if (u % 4 == 0) act_scale[u / 4] = block_scale(amax);
}

// The integer dot product of unit u (8 weights of a block) of a row with the activations, before
// the two scales. Q4_0: a block is 9 halfwords (f16 d, 16 bytes of nibbles; weight = d * (nibble -
// 8)); unit u takes qs[4j .. 4j + 3] (j = u % 4), whose low nibbles are elements 4j .. and high
// nibbles 16 + 4j ... Q8_0: 17 halfwords (f16 d, 32 signed bytes); unit u takes bytes 8j .. 8j + 7.
#if defined(A_Q4_0)
#define BLOCK_HALVES 9
#define UNIT_DOT(W)                                                                                  \
  {                                                                                                  \
    const uint hw = BLOCK_HALVES * (row * (K / 32) + u / 4), q = hw + 1 + 2 * (u % 4);               \
    const uint w = uint(W[q]) | (uint(W[q + 1]) << 16);                                              \
    const uint a0 = act_words[8 * (u / 4) + u % 4], a1 = act_words[8 * (u / 4) + u % 4 + 4];         \
    const int s = dot4x8(w & 0x0F0F0F0Fu, a0) + dot4x8((w >> 4) & 0x0F0F0F0Fu, a1) -                 \
                  8 * (dot4x8(a0, 0x01010101u) + dot4x8(a1, 0x01010101u));                           \
    return unpackHalf2x16(uint(W[hw])).x * act_scale[u / 4] * float(s);                              \
  }
#elif defined(A_Q8_0)
#define BLOCK_HALVES 17
#define UNIT_DOT(W)                                                                                  \
  {                                                                                                  \
    const uint hw = BLOCK_HALVES * (row * (K / 32) + u / 4), q = hw + 1 + 4 * (u % 4);               \
    const uint w0 = uint(W[q]) | (uint(W[q + 1]) << 16), w1 = uint(W[q + 2]) | (uint(W[q + 3]) << 16); \
    const int s = dot4x8(w0, act_words[2 * u]) + dot4x8(w1, act_words[2 * u + 1]);                  \
    return unpackHalf2x16(uint(W[hw])).x * act_scale[u / 4] * float(s);                              \
  }
#endif
float gate_unit(uint row, uint u, uint K) UNIT_DOT(w_gate)
float up_unit(uint row, uint u, uint K) UNIT_DOT(w_up)
float down_unit(uint row, uint u, uint K) UNIT_DOT(w_down)

// Items (a chunk of K of a row; the chunks of a row are consecutive items) go to subgroups in
// steps: at step t subgroup w of workgroup g takes item (t * groups + g) * subgroups + w, so that
// the whole grid reads one window of the matrix at a time, front to back, as a stream (each
// workgroup on rows of its own read 1.5x slower on the H100). A row's chunks are in one workgroup
// (chunks divide the subgroups), which sums them in shared memory after each round of steps.
uint item_of(uint t) { return (t * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_NumSubgroups + gl_SubgroupID; }
uint steps_for(uint items) {
  const uint slots = gl_NumWorkGroups.x * gl_NumSubgroups;
  return (items + slots - 1) / slots;
}

// Every workgroup's writes before it are visible to every workgroup after it.
void grid_barrier() {
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
  if (gl_LocalInvocationIndex == 0) {
    atomicAdd(sync[p.sync_slot], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
    uint spins = 0;
    while (atomicLoad(sync[p.sync_slot], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed) <
           gl_NumWorkGroups.x) {
      if (++spins == SYNC_SPINS) {
        atomicAdd(sync[0], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
        break;
      }
    }
    atomicLoad(sync[p.sync_slot], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire);
  }
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
}

void main() {
  const uint tid = gl_LocalInvocationIndex, threads = gl_WorkGroupSize.x;
  const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;

  // Phase 1: a = int8(rmsnorm(x) * norm weight), then h = silu(gate . a) * (up . a).
  {
    const uint K = p.n_embd;
    float ss = 0.0;
    for (uint q = tid; q < K / 4; q += threads) ss += dot(x4[q], x4[q]);
    const float inv_rms = inversesqrt(workgroup_sum(ss) / float(K) + p.eps);
    for (uint u = tid; u < K / 8; u += threads) {
      put_unit(u, x4[2 * u] * inv_rms * nw4[2 * u], x4[2 * u + 1] * inv_rms * nw4[2 * u + 1]);
    }
    barrier();

    const uint chunks = p.chunks_up, chunk_units = (K / 8) / chunks, items = p.n_ff * chunks;
    const uint steps = steps_for(items), per_round = ROUND / gl_NumSubgroups, rows_a_step = gl_NumSubgroups / chunks;
    for (uint t0 = 0; t0 < steps; t0 += per_round) {
      const uint t1 = min(steps, t0 + per_round);
      for (uint t = t0; t < t1; ++t) {
        const uint item = item_of(t), row = item / chunks, first = (item % chunks) * chunk_units;
        const uint end = item < items ? first + chunk_units : first;
        float g = 0.0, v = 0.0;
        uint u = first + lane;
        for (; u + (UNROLL - 1) * lanes < end; u += UNROLL * lanes) {
          [[unroll]] for (uint k = 0; k < UNROLL; ++k) {
            g += gate_unit(row, u + k * lanes, K);
            v += up_unit(row, u + k * lanes, K);
          }
        }
        for (; u < end; u += lanes) {
          g += gate_unit(row, u, K);
          v += up_unit(row, u, K);
        }
        g = subgroupAdd(g);
        v = subgroupAdd(v);
        if (subgroupElect()) {
          part_a[(t - t0) * gl_NumSubgroups + gl_SubgroupID] = g;
          part_b[(t - t0) * gl_NumSubgroups + gl_SubgroupID] = v;
        }
      }
      barrier();
      for (uint j = tid; j < (t1 - t0) * rows_a_step; j += threads) {
        const uint t = t0 + j / rows_a_step, slot = (t - t0) * gl_NumSubgroups + (j % rows_a_step) * chunks;
        const uint item = (t * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_NumSubgroups + (j % rows_a_step) * chunks;
        if (item >= items) continue;
        float g = 0.0, v = 0.0;
        for (uint c = 0; c < chunks; ++c) {
          g += part_a[slot + c];
          v += part_b[slot + c];
        }
        h[item / chunks] = g / (1.0 + exp(-g)) * v;
      }
      barrier();
    }
  }

  grid_barrier();

  // Phase 2: x += down . int8(h).
  {
    const uint K = p.n_ff;
    for (uint u = tid; u < K / 8; u += threads) put_unit(u, h4[2 * u], h4[2 * u + 1]);
    barrier();

    const uint chunks = p.chunks_down, chunk_units = (K / 8) / chunks, items = p.n_embd * chunks;
    const uint steps = steps_for(items), per_round = ROUND / gl_NumSubgroups, rows_a_step = gl_NumSubgroups / chunks;
    for (uint t0 = 0; t0 < steps; t0 += per_round) {
      const uint t1 = min(steps, t0 + per_round);
      for (uint t = t0; t < t1; ++t) {
        const uint item = item_of(t), row = item / chunks, first = (item % chunks) * chunk_units;
        const uint end = item < items ? first + chunk_units : first;
        float s = 0.0;
        uint u = first + lane;
        for (; u + (UNROLL - 1) * lanes < end; u += UNROLL * lanes) {
          [[unroll]] for (uint k = 0; k < UNROLL; ++k) s += down_unit(row, u + k * lanes, K);
        }
        for (; u < end; u += lanes) s += down_unit(row, u, K);
        s = subgroupAdd(s);
        if (subgroupElect()) part_a[(t - t0) * gl_NumSubgroups + gl_SubgroupID] = s;
      }
      barrier();
      for (uint j = tid; j < (t1 - t0) * rows_a_step; j += threads) {
        const uint t = t0 + j / rows_a_step, slot = (t - t0) * gl_NumSubgroups + (j % rows_a_step) * chunks;
        const uint item = (t * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_NumSubgroups + (j % rows_a_step) * chunks;
        if (item >= items) continue;
        float s = 0.0;
        for (uint c = 0; c < chunks; ++c) s += part_a[slot + c];
        x[item / chunks] += s;
      }
      barrier();
    }
  }
}
