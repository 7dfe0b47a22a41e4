// What the persistent decode kernels share (ffn_decode.comp, attn_decode.comp): a grid of one
// workgroup on each SM, all resident at once, working through phases separated by grid barriers;
// int8 activations in shared memory that every workgroup makes itself; products whose rows are
// split into items (a chunk of K of a row) that subgroups take in steps over the whole grid.
//
// The includer declares before it: MAX_K (a specialization constant: the longest K, a multiple of
// 32), SYNC_BINDING, and the buffers x4 (vec4) and x (float) of the residual stream and nw4 (vec4)
// of a norm weight, and A_Q4_0 or A_Q8_0.
//
// Grid barrier: the host zeroes the step's sync words before the first layer (a word for each
// barrier). A workgroup that waits too long (workgroups not resident together: another device, or
// another process's work on this one) gives up, counts the failure in word 0, which the host checks
// after the step, and goes on, rather than hanging the GPU.
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#include "int8_blocks.glsl"
#include "int8_dot.glsl"
#include "reduce.glsl"

layout(binding = SYNC_BINDING) coherent buffer Sync { uint sync[]; };

// A wait lasts what the slowest workgroup's share of a phase takes (tens of us: a few hundred
// polls); 2^15 polls (~20 ms on the H100) is far past that, and short enough that a grid that cannot
// be resident fails its step quickly rather than hanging. Lavapipe ends any loop after 65,535
// iterations on its own (gallivm's loop limiter), so a larger limit would never be reached there.
const uint SYNC_SPINS = 1u << 15;
// Units a lane loads before it sums them. A specialization constant: as a plain constant glslc
// unrolls the loop itself and the H100 ran the feed-forward block 53.5 -> 68.8 us; left to the
// driver, 2, 4 and 8 ran alike.
layout(constant_id = 7) const uint UNROLL = 4;
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

// Every workgroup's writes before it are visible to every workgroup after it (sync word `slot`).
void grid_barrier(uint slot) {
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
  if (gl_LocalInvocationIndex == 0) {
    atomicAdd(sync[slot], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
    uint spins = 0;
    while (atomicLoad(sync[slot], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed) <
           gl_NumWorkGroups.x) {
      if (++spins == SYNC_SPINS) {
        atomicAdd(sync[0], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
        break;
      }
    }
    atomicLoad(sync[slot], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire);
  }
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
}

// a = int8(rmsnorm(x) * norm weight) of K elements into shared memory, by every workgroup.
void put_normed(uint K, float eps) {
  const uint tid = gl_LocalInvocationIndex, threads = gl_WorkGroupSize.x;
  float ss = 0.0;
  for (uint q = tid; q < K / 4; q += threads) ss += dot(x4[q], x4[q]);
  const float inv_rms = inversesqrt(workgroup_sum(ss) / float(K) + eps);
  for (uint u = tid; u < K / 8; u += threads) {
    put_unit(u, x4[2 * u] * inv_rms * nw4[2 * u], x4[2 * u + 1] * inv_rms * nw4[2 * u + 1]);
  }
  barrier();
}

// NAME(M, K, chunks): x[r] += W[r] . a for the M rows of a matrix K wide (UNIT: its unit dot
// product), a in shared memory, each row in `chunks` items; every invocation calls it.
#define DEFINE_RESIDUAL_PRODUCT(NAME, UNIT)                                                           \
  void NAME(uint M, uint K, uint chunks) {                                                           \
    const uint tid = gl_LocalInvocationIndex, threads = gl_WorkGroupSize.x;                          \
    const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;                              \
    const uint chunk_units = (K / 8) / chunks, items = M * chunks;                                   \
    const uint steps = steps_for(items), per_round = ROUND / gl_NumSubgroups;                        \
    const uint rows_a_step = gl_NumSubgroups / chunks;                                               \
    for (uint t0 = 0; t0 < steps; t0 += per_round) {                                                 \
      const uint t1 = min(steps, t0 + per_round);                                                    \
      for (uint t = t0; t < t1; ++t) {                                                               \
        const uint item = item_of(t), row = item / chunks, first = (item % chunks) * chunk_units;    \
        const uint end = item < items ? first + chunk_units : first;                                 \
        float s = 0.0;                                                                               \
        uint u = first + lane;                                                                       \
        for (; u + (UNROLL - 1) * lanes < end; u += UNROLL * lanes) {                                \
          [[unroll]] for (uint k = 0; k < UNROLL; ++k) s += UNIT(row, u + k * lanes, K);             \
        }                                                                                            \
        for (; u < end; u += lanes) s += UNIT(row, u, K);                                            \
        s = subgroupAdd(s);                                                                          \
        if (subgroupElect()) part_a[(t - t0) * gl_NumSubgroups + gl_SubgroupID] = s;                 \
      }                                                                                              \
      barrier();                                                                                     \
      for (uint j = tid; j < (t1 - t0) * rows_a_step; j += threads) {                                \
        const uint t = t0 + j / rows_a_step, slot = (t - t0) * gl_NumSubgroups + (j % rows_a_step) * chunks; \
        const uint item = (t * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_NumSubgroups +            \
                          (j % rows_a_step) * chunks;                                                \
        if (item >= items) continue;                                                                 \
        float s = 0.0;                                                                               \
        for (uint c = 0; c < chunks; ++c) s += part_a[slot + c];                                     \
        x[item / chunks] += s;                                                                       \
      }                                                                                              \
      barrier();                                                                                     \
    }                                                                                                \
  }

// NAME(M, K, chunks): FINISH(r, A[r] . a, B[r] . a) for r < M, where A and B are two rows that
// each item takes together (UNIT_A, UNIT_B: their unit dot products, given r), a in shared memory;
// every invocation calls it.
#define DEFINE_PAIR_PRODUCT(NAME, UNIT_A, UNIT_B, FINISH)                                             \
  void NAME(uint M, uint K, uint chunks) {                                                           \
    const uint tid = gl_LocalInvocationIndex, threads = gl_WorkGroupSize.x;                          \
    const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;                              \
    const uint chunk_units = (K / 8) / chunks, items = M * chunks;                                   \
    const uint steps = steps_for(items), per_round = ROUND / gl_NumSubgroups;                        \
    const uint rows_a_step = gl_NumSubgroups / chunks;                                               \
    for (uint t0 = 0; t0 < steps; t0 += per_round) {                                                 \
      const uint t1 = min(steps, t0 + per_round);                                                    \
      for (uint t = t0; t < t1; ++t) {                                                               \
        const uint item = item_of(t), row = item / chunks, first = (item % chunks) * chunk_units;    \
        const uint end = item < items ? first + chunk_units : first;                                 \
        float a = 0.0, b = 0.0;                                                                      \
        uint u = first + lane;                                                                       \
        for (; u + (UNROLL - 1) * lanes < end; u += UNROLL * lanes) {                                \
          [[unroll]] for (uint k = 0; k < UNROLL; ++k) {                                             \
            a += UNIT_A(row, u + k * lanes, K);                                                      \
            b += UNIT_B(row, u + k * lanes, K);                                                      \
          }                                                                                          \
        }                                                                                            \
        for (; u < end; u += lanes) {                                                                \
          a += UNIT_A(row, u, K);                                                                    \
          b += UNIT_B(row, u, K);                                                                    \
        }                                                                                            \
        a = subgroupAdd(a);                                                                          \
        b = subgroupAdd(b);                                                                          \
        if (subgroupElect()) {                                                                       \
          part_a[(t - t0) * gl_NumSubgroups + gl_SubgroupID] = a;                                    \
          part_b[(t - t0) * gl_NumSubgroups + gl_SubgroupID] = b;                                    \
        }                                                                                            \
      }                                                                                              \
      barrier();                                                                                     \
      for (uint j = tid; j < (t1 - t0) * rows_a_step; j += threads) {                                \
        const uint t = t0 + j / rows_a_step, slot = (t - t0) * gl_NumSubgroups + (j % rows_a_step) * chunks; \
        const uint item = (t * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_NumSubgroups +            \
                          (j % rows_a_step) * chunks;                                                \
        if (item >= items) continue;                                                                 \
        float a = 0.0, b = 0.0;                                                                      \
        for (uint c = 0; c < chunks; ++c) {                                                          \
          a += part_a[slot + c];                                                                     \
          b += part_b[slot + c];                                                                     \
        }                                                                                            \
        FINISH(item / chunks, a, b);                                                                 \
      }                                                                                              \
      barrier();                                                                                     \
    }                                                                                                \
  }
