#version 450
// out(N, M) = activations(N, K) x weights(M, K)^T on tensor cores, for everything wider than the
// vector path: decode batches and prefill chunks. VK_NV_cooperative_matrix; built only into
// pipelines on devices that report it, never on lavapipe.
//
// A workgroup owns a BM x BN tile of the output (BM = SG_M * TM * 16 rows, BN = SG_N * TN * CM_N
// columns); each of its SG_M x SG_N subgroups owns TM x TN fragments of it. K advances 32 * KB at
// a time (KB GGUF blocks) through two shared-memory stages: while the tensor cores multiply the
// tile in one stage, the loads for the next are in flight, and the whole workgroup then
// dequantizes them to F16 into the other stage; one barrier per step. Weights are read from memory once per BN columns.
// Dequantization works on packed halves (dequant_f16.glsl); the types of quant_units.glsl are
// decoded by it (decode batches: wider products take them through F16, dequant_f16.comp).
// ACCUMULATE: out += the product (the residual add, fused). A grid of z > 1 splits K: workgroup z
// takes the z-th share of the blocks and writes its sums to slice z of out (N x M each), which
// the host then adds up (sum_splits.comp), for grids too small to fill the GPU.
//
// GLU: the SwiGLU of a feed-forward block in one dispatch. Binding 0 holds the gate matrix, 3 the
// up matrix (M rows each, the same type); each subgroup's two 16-row fragments (TM = 2) are the same
// 16 features of both, so its accumulators hold gate and up of one output, and it writes
// silu(gate) * up as F16 into binding 2: (N, M), the input of the down product. N counts the padded
// columns (zero in, zero out). No K split, no ACCUMULATE.
//
// EXPERTS: a mixture of experts' wide product (mul_mm_id.comp's, on the tensor cores). Grid y walks
// the tiles moe_sort (moe.comp) made, at most BN pairs routed to one expert each: the workgroup
// multiplies BM rows of that expert's matrix (binding 0 holds every expert's M rows in turn) by the
// tile's activation rows, gathered through `order` (binding 3; the row of pair q is q, or q / slots
// where the activations are a row a token), and writes each pair's output row (pair, M) of out.
// Columns past the tile's pairs load its first pair's row (no padding needed); their fragments are
// neither multiplied nor written. No K split, no ACCUMULATE. With GLU too (F16 weights only): binding
// 0 every expert's gate rows, 5 their up rows, and each pair's silu(gate) * up row (pair, M) goes
// to binding 2 as F16, the down product's input.
//
// The host guarantees: subgroups of 32, K % 32 == 0, M % 16 == 0 for F16 weights, 16-byte aligned
// buffer offsets, activations F16 with their columns padded to whole BN tiles (the pad zero).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#if defined(EXPERTS) && defined(GLU) && !defined(A_F16)
#error "the experts' SwiGLU reads F16 weights"
#endif
#if defined(GLU) && SHAPE_TM != 2
#error "GLU takes two 16-row fragments a subgroup (TM = 2): gate and up"
#endif

// The shape is fixed at compile time (one module per shape), so that the loops over fragments
// unroll and every fragment index is a constant: arrays of fragments then live in registers.
const uint SG_M = SHAPE_SG_M;  // subgroups along M
const uint SG_N = SHAPE_SG_N;  // subgroups along N
const uint TM = SHAPE_TM;      // 16-row fragments per subgroup
const uint TN = SHAPE_TN;      // CM_N-column fragments per subgroup
const uint KB = SHAPE_KB;      // blocks of 32 along K per stage
layout(local_size_x = 32 * SG_M * SG_N) in;
layout(constant_id = 5) const uint ACCUMULATE = 0;  // 1: out += the product
#if defined(EXPERTS)
// N: rows of the activations; tile0: the first tile of this dispatch (grids are at most 65535 high).
layout(push_constant) uniform Params { uint M; uint K; uint slots; uint per_slot; uint tile0; uint N; } p;
layout(binding = 3) readonly buffer Order { uint order[]; };
layout(binding = 4) readonly buffer Tiles { uvec4 tiles[]; };  // word 0: the count; then (expert, first, pairs, 0)
#define UP_BINDING 5  // GLU's up matrix
#else
#define UP_BINDING 3
layout(push_constant) uniform Params { uint M; uint K; uint N; } p;
#endif

layout(binding = 1) readonly buffer Acts { uvec4 b4[]; };  // F16, 8 to a word
layout(binding = 2) buffer Out { float out_data[]; };
#if defined(GLU)
layout(binding = 2) writeonly buffer Out16 { float16_t out16[]; };
#endif

const uint THREADS = 32 * SG_M * SG_N;
// A subgroup with few fragments would chain every product of a step on the one before it (the
// K-step loop is rolled, see main); SETS sets of accumulators, taken in turn, let SETS of them
// overlap. The sets are added up at the end.
const uint FRAGS = TM * TN;
#ifdef SHAPE_SETS
const uint SETS = SHAPE_SETS;
#else
const uint SETS = FRAGS >= 4 ? 1 : min(4 / FRAGS, 2 * KB);
#endif
const uint GROUP_M = 8;  // row tiles a group of workgroups shares (see main)
const uint BM = SG_M * TM * 16;
const uint BN = SG_N * TN * CM_N;
// A row of a stage: 32 * KB F16 (4 * KB words of 16 bytes) and one word of pad, so that the rows a
// fragment load reads start on different banks. Strides and offsets below count 16-byte words.
const uint STRIDE = 4 * KB + 1;
const uint A_STAGE = BM * STRIDE;
const uint B_STAGE = BN * STRIDE;
// Two stages where they fit in 48 KiB beside tile_c; otherwise one, which the workgroup refills
// after a second barrier (the next step's loads are still in flight while it multiplies).
const uint C_WORDS = SG_M * SG_N * 16 * CM_N / 4;
// (4 words, 64 bytes, kept for quant_units.glsl's table of IQ4's levels.)
const uint STAGES = 2 * (A_STAGE + B_STAGE) + C_WORDS + 4 <= 3072 ? 2 : 1;
shared uvec4 tile_a[STAGES * A_STAGE];  // [stage][m][k]
shared uvec4 tile_b[STAGES * B_STAGE];  // [stage][n][k]: column-major K x N
// Edge fragments go through here (one per subgroup) to be written element by element.
shared float tile_c[SG_M * SG_N * 16 * CM_N];
#if defined(EXPERTS)
shared uint tile_pairs[BN];  // the tile's pairs; past its count, its first again (read, never written)
uint expert_first = 0;       // the first weight row of the tile's expert
#else
const uint expert_first = 0;
#endif

#include "dequant_f16.glsl"

// The weight row of row rho of a stage for the workgroup at row m0, and (GLU) whether it is the up
// matrix's: a subgroup's rows 32 s .. 32 s + 15 are gate rows of features m0 / 2 + 16 s .., its rows
// 32 s + 16 .. 32 s + 31 up rows of the same features.
#if defined(GLU)
uint a_row(uint m0, uint rho) { return expert_first + min(m0 / 2 + (rho / 32) * 16 + rho % 16, p.M - 1); }
bool a_up(uint rho) { return (rho / 16) % 2 == 1; }
#else
uint a_row(uint m0, uint rho) { return expert_first + min(m0 + rho, p.M - 1); }
bool a_up(uint rho) { return false; }
#endif

#if defined(A_F16)
const bool DECODES_ON_LOAD = false;
layout(binding = 0) readonly buffer W { uvec4 w4[]; };
#if defined(GLU)
layout(binding = UP_BINDING) readonly buffer W2 { uvec4 w4_up[]; };
#endif
// A stage of weights: BM rows x 4 * KB words; each thread carries A_LOADS of them.
const uint A_UNITS = BM * 4 * KB;
const uint A_LOADS = (A_UNITS + THREADS - 1) / THREADS;
uvec4 a_regs[A_LOADS];

void load_a(uint m0, uint b) {
  [[unroll]] for (uint i = 0; i < A_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u < A_UNITS) {
      const uint row = a_row(m0, u / (4 * KB)), at = (row * p.K + 32 * KB * b) / 8 + u % (4 * KB);
#if defined(GLU)
      [[dont_flatten]] if (a_up(u / (4 * KB))) {
        a_regs[i] = w4_up[at];
        continue;
      }
#endif
      a_regs[i] = w4[at];
    }
  }
}

void store_a(uint stage) {
  [[unroll]] for (uint i = 0; i < A_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u < A_UNITS) tile_a[stage * A_STAGE + (u / (4 * KB)) * STRIDE + u % (4 * KB)] = a_regs[i];
  }
}
#elif !defined(A_Q4_0) && !defined(A_Q8_0)
// The types of quant_units.glsl (Q4_1 .. IQ4_XS, Q4_K): each thread decodes A_LOADS blocks of 32 to
// F16 as it loads them (the decoding reads memory itself: its loads cannot be issued a step ahead
// apart from it), after the multiply of the stage before (see main), for the 64 bytes store_a writes.
#if defined(GLU)
#error "the SwiGLU module reads F16, Q8_0 and Q4_0 weights"
#endif
#define QW_BINDING 0
#define IQ4_FLOAT_LEVELS  // IQ4's levels from a table of 16 floats (init_iq4_float_levels in main)
#include "quant_units.glsl"
const bool DECODES_ON_LOAD = true;
const uint A_UNITS = BM * KB;
const uint A_LOADS = (A_UNITS + THREADS - 1) / THREADS;
uvec4 a_f16[A_LOADS][4];

void load_a(uint m0, uint b) {
  [[unroll]] for (uint i = 0; i < A_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u < A_UNITS) block32_f16(a_row(m0, u / KB), KB * b + u % KB, p.K, a_f16[i]);
  }
}

void store_a(uint stage) {
  [[unroll]] for (uint i = 0; i < A_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u >= A_UNITS) continue;
    const uint base = stage * A_STAGE + (u / KB) * STRIDE + 4 * (u % KB);
    [[unroll]] for (uint k = 0; k < 4; ++k) tile_a[base + k] = a_f16[i][k];
  }
}
#else
layout(binding = 0) readonly buffer W { uint w32[]; };
#if defined(GLU)
layout(binding = UP_BINDING) readonly buffer W2 { uint w32_up[]; };
#endif
const bool DECODES_ON_LOAD = false;
// A stage of weights: BM rows x KB blocks; each thread carries A_LOADS blocks, each as the WORDS
// 32-bit words that cover it (half as many loads and registers as 16-bit halfwords: the
// registers bound how many workgroups an SM holds). A block of an even index starts on a word
// boundary (its scale the first word's low half, its quants 2 bytes on); one of an odd index 2
// bytes past one (its scale the first word's high half, its quants the words after).
const uint A_UNITS = BM * KB;
const uint A_LOADS = (A_UNITS + THREADS - 1) / THREADS;
#if defined(A_Q4_0)
const uint BLOCK_HALFWORDS = 9;
#else
const uint BLOCK_HALFWORDS = 17;
#endif
const uint WORDS = (BLOCK_HALFWORDS + 1) / 2;
uint a_words[A_LOADS * WORDS];
bool a_odd[A_LOADS];

// The words of load i's block, from word w0 of the weight buffer BUF (the gate's or the up
// matrix's: a macro, since a GLSL function takes no buffer). An even block's last word is half the
// next block's: past the matrix for its last block, hence the clamp.
#define LOAD_BLOCK_WORDS(BUF)                                                                   \
  [[unroll]] for (uint w = 0; w + 1 < WORDS; ++w) a_words[i * WORDS + w] = BUF[w0 + w];          \
  a_words[i * WORDS + WORDS - 1] = BUF[min(w0 + WORDS - 1, uint(BUF.length()) - 1)];

void load_a(uint m0, uint b) {
  [[unroll]] for (uint i = 0; i < A_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u < A_UNITS) {
      const uint row = a_row(m0, u / KB);
      const uint h = BLOCK_HALFWORDS * (row * (p.K / 32) + KB * b + u % KB), w0 = h / 2;
      a_odd[i] = (h & 1u) != 0u;
#if defined(GLU)
      // The same for every thread of a subgroup where KB > 1 (its rows lie in one 16-row fragment): a
      // branch, not both loads.
      [[dont_flatten]] if (a_up(u / KB)) {
        LOAD_BLOCK_WORDS(w32_up)
        continue;
      }
#endif
      LOAD_BLOCK_WORDS(w32)
    }
  }
}

// The block's scale, and its quant bytes 4j .. 4j + 3 as a little-endian word.
float16_t block_scale(uint i) {
  const uint first = a_words[i * WORDS];
  return uint16BitsToFloat16(uint16_t(a_odd[i] ? first >> 16 : first & 0xFFFFu));
}
uint quant_word(uint i, uint j) {
  const uint lo = a_words[i * WORDS + j], hi = a_words[i * WORDS + j + 1];
  return a_odd[i] ? hi : (lo >> 16) | (hi << 16);
}

void store_a(uint stage) {
  [[unroll]] for (uint i = 0; i < A_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u >= A_UNITS) continue;
    const uint base = stage * A_STAGE + (u / KB) * STRIDE + 4 * (u % KB);
    const float16_t d = block_scale(i);
#if defined(A_Q4_0)
    [[unroll]] for (uint half_ = 0; half_ < 2; ++half_) {
      uvec4 lo, hi;
      q4_0_half_to_f16(d, quant_word(i, 2 * half_), quant_word(i, 2 * half_ + 1), lo, hi);
      tile_a[base + half_] = lo;
      tile_a[base + 2 + half_] = hi;
    }
#else
    [[unroll]] for (uint k = 0; k < 4; ++k) {
      const uint x0 = quant_word(i, 2 * k), x1 = quant_word(i, 2 * k + 1);
      tile_a[base + k] = uvec4(q8_0_pair_to_f16(d, x0), q8_0_pair_to_f16(d, x0 >> 16), q8_0_pair_to_f16(d, x1),
                               q8_0_pair_to_f16(d, x1 >> 16));
    }
#endif
  }
}
#endif

// A stage of activations: BN columns x 4 * KB words.
const uint B_UNITS = BN * 4 * KB;
const uint B_LOADS = (B_UNITS + THREADS - 1) / THREADS;
uvec4 b_regs[B_LOADS];

// The activation row of column c of the tile.
#if defined(EXPERTS)
uint b_row(uint n0, uint c) { return p.per_slot != 0 ? tile_pairs[c] : tile_pairs[c] / p.slots; }
#else
uint b_row(uint n0, uint c) { return n0 + c; }
#endif

void load_b(uint n0, uint b) {
  [[unroll]] for (uint i = 0; i < B_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u < B_UNITS) b_regs[i] = b4[(b_row(n0, u / (4 * KB)) * p.K + 32 * KB * b) / 8 + u % (4 * KB)];
  }
}

void store_b(uint stage) {
  [[unroll]] for (uint i = 0; i < B_LOADS; ++i) {
    const uint u = gl_LocalInvocationIndex + i * THREADS;
    if (u < B_UNITS) tile_b[stage * B_STAGE + (u / (4 * KB)) * STRIDE + u % (4 * KB)] = b_regs[i];
  }
}

bool whole_fragment(uint m, uint n) { return m + 16 <= p.M && n + CM_N <= p.N && p.M % 4 == 0; }

void main() {
#if defined(IQ4_FLOAT_LEVELS) && (defined(A_IQ4_NL) || defined(A_IQ4_XS))
  init_iq4_float_levels();
#endif
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint sm = sg % SG_M, sn = sg / SG_M;
  // Workgroups start in the order of their flat index (x fastest). Taken as (row tile, column tile)
  // directly, the workgroups running together would share one column tile and sweep all of the
  // weights, once for each column tile: wide products read their weights from memory N / BN times.
  // Instead the flat index walks groups of GROUP_M row tiles: each group's weight rows stay in L2
  // while every column tile passes over them (the activations, a few MiB, stay there throughout).
  // With one column tile (decode) this is the plain order.
#if defined(EXPERTS)
  // A column tile is one expert's tile of pairs (its own weights): the plain order.
  const uint t = p.tile0 + gl_WorkGroupID.y;
  if (t >= tiles[0].x) return;  // past the step's tiles (the whole workgroup)
  const uvec4 tile = tiles[1 + t];  // expert, first position in order, pairs
  expert_first = tile.x * p.M;
  for (uint c = gl_LocalInvocationIndex; c < BN; c += THREADS) tile_pairs[c] = order[tile.y + min(c, tile.z - 1)];
  barrier();
  const uint m0 = gl_WorkGroupID.x * BM, n0 = 0;
#else
  const uint tiles_m = gl_NumWorkGroups.x, tiles_n = gl_NumWorkGroups.y;
  const uint flat_index = gl_WorkGroupID.y * tiles_m + gl_WorkGroupID.x, per_group = GROUP_M * tiles_n;
  const uint group_m0 = (flat_index / per_group) * GROUP_M, in_group = flat_index % per_group;
  const uint group_rows = min(GROUP_M, tiles_m - group_m0);
  const uint m0 = (group_m0 + in_group % group_rows) * BM, n0 = (in_group / group_rows) * BN;
#endif
  // Split K (grid z > 1): this workgroup's share of the blocks, its sums written to slice z of out
  // (N x M each), which the host then adds up (sum_splits).
  const uint blocks = p.K / (32 * KB), splits = gl_NumWorkGroups.z, per_split = (blocks + splits - 1) / splits;
  const uint b_begin = min(gl_WorkGroupID.z * per_split, blocks), b_end = min(b_begin + per_split, blocks);
  const uint o_base = gl_WorkGroupID.z * p.N * p.M;

  // Whole fragments inside the output (with 16-byte aligned columns) are read and written in place
  // (with ACCUMULATE they start from out); the others go through this subgroup's slice of tile_c.
  fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> acc[SETS * FRAGS];
  [[unroll]] for (uint f = 0; f < SETS * FRAGS; ++f) acc[f] = fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>(0.0);
  [[unroll]] for (uint i = 0; i < TM; ++i) {
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      const uint m = m0 + sm * TM * 16 + 16 * i, n = n0 + sn * TN * CM_N + CM_N * j;
      if (ACCUMULATE != 0u && whole_fragment(m, n)) {
        coopMatLoadNV(acc[i * TN + j], out_data, o_base + n * p.M + m, p.M, true);
      }
    }
  }

  // One stage's loads are in flight while the tensor cores work on the other (deeper prefetch,
  // through more register slots, measured no faster on the H100).
  if (b_begin < b_end) {  // a split's share may be empty: read nothing past the weights
    load_a(m0, b_begin);
    load_b(n0, b_begin);
  }
  store_a(0);
  store_b(0);
  barrier();
  for (uint b = b_begin; b < b_end; ++b) {
    const uint stage = STAGES == 2 ? (b - b_begin) % 2 : 0;
    if (b + 1 < b_end) {
      // Weights decoded as they load would hold the multiply up behind their loads: after it.
      if (!DECODES_ON_LOAD) load_a(m0, b + 1);
      load_b(n0, b + 1);
    }
    // Not unrolled: unrolled, the fragment steps made kernels of 60-115 KB, whose instruction
    // fetches cost more than the loop (H100, Q4_0 decode steps: 16 sequences 10.9 -> 9.3 ms, 64:
    // 16.5 -> 15.7, 32: 12.1 -> 12.4; prefill +7%; bench/results/tensor-cores-2026-11-26-h100.md).
    // Narrow shapes take SETS steps of 16 a pass, each into its own accumulators (see SETS).
    [[dont_unroll]] for (uint h0 = 0; h0 < 2 * KB; h0 += SETS) {
      [[unroll]] for (uint s = 0; s < SETS; ++s) {
        const uint h = h0 + s;
        fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a[TM];
        [[unroll]] for (uint i = 0; i < TM; ++i) {
          coopMatLoadNV(a[i], tile_a, stage * A_STAGE + (sm * TM * 16 + 16 * i) * STRIDE + 2 * h, STRIDE, false);
        }
        [[unroll]] for (uint j = 0; j < TN; ++j) {
#if defined(EXPERTS)
          if (sn * TN * CM_N + CM_N * j >= tile.z) continue;  // no pair of the tile in these columns
#endif
          fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> bj;
          coopMatLoadNV(bj, tile_b, stage * B_STAGE + (sn * TN * CM_N + CM_N * j) * STRIDE + 2 * h, STRIDE, true);
          [[unroll]] for (uint i = 0; i < TM; ++i) {
            acc[s * FRAGS + i * TN + j] = coopMatMulAddNV(a[i], bj, acc[s * FRAGS + i * TN + j]);
          }
        }
      }
    }
    if (STAGES == 1) barrier();  // every subgroup is done with the one stage
    if (b + 1 < b_end) {  // the next stage into the other buffer (or the one, refilled)
      if (DECODES_ON_LOAD) load_a(m0, b + 1);
      store_a(STAGES - 1 - stage);
      store_b(STAGES - 1 - stage);
    }
    barrier();
  }

  // The sets' sums into the first (element by element: each invocation holds the same elements of
  // every fragment of one type; glslc 2023.2 crashes on whole-matrix addition).
  [[unroll]] for (uint s = 1; s < SETS; ++s) {
    [[unroll]] for (uint f = 0; f < FRAGS; ++f) {
      [[unroll]] for (uint e = 0; e < acc[f].length(); ++e) acc[f][e] += acc[s * FRAGS + f][e];
    }
  }
  const uint c_base = sg * 16 * CM_N;
#if defined(EXPERTS) && defined(GLU)
  // Fragment 0 of each column is the gate, fragment 1 the up product, of features f0 .. f0 + 15 of
  // the tile's expert; each column a pair's F16 row, through tile_c element by element.
  const uint f0 = m0 / 2 + sm * 16;
  [[unroll]] for (uint j = 0; j < TN; ++j) {
    const uint c0 = sn * TN * CM_N + CM_N * j;
    if (f0 >= p.M || c0 >= tile.z) continue;
    fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> h = acc[j];
    [[unroll]] for (uint e = 0; e < h.length(); ++e) {
      const float g = acc[j][e];
      h[e] = g / (1.0 + exp(-g)) * acc[TN + j][e];
    }
    coopMatStoreNV(h, tile_c, c_base, 16, true);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint e = lane; e < 16 * CM_N; e += 32) {
      const uint row = f0 + e % 16, c = c0 + e / 16;
      if (row < p.M && c < tile.z) out16[tile_pairs[c] * p.M + row] = float16_t(tile_c[c_base + e]);
    }
    subgroupBarrier();
  }
  return;
#elif defined(EXPERTS)
  // Each column is a pair's output row: every fragment goes through tile_c, element by element.
  [[unroll]] for (uint i = 0; i < TM; ++i) {
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      const uint m = m0 + sm * TM * 16 + 16 * i, c0 = sn * TN * CM_N + CM_N * j;
      if (m >= p.M || c0 >= tile.z) continue;
      coopMatStoreNV(acc[i * TN + j], tile_c, c_base, 16, true);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (uint e = lane; e < 16 * CM_N; e += 32) {
        const uint row = m + e % 16, c = c0 + e / 16;
        if (row < p.M && c < tile.z) out_data[tile_pairs[c] * p.M + row] = tile_c[c_base + e];
      }
      subgroupBarrier();
    }
  }
  return;
#endif
#if defined(GLU) && !defined(EXPERTS)
  // Fragment 0 of each column is the gate, fragment 1 the up product, of features f0 .. f0 + 15.
  const uint f0 = m0 / 2 + sm * 16;
  [[unroll]] for (uint j = 0; j < TN; ++j) {
    const uint n = n0 + sn * TN * CM_N + CM_N * j;
    if (f0 >= p.M || n >= p.N) continue;
    fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> h = acc[j];
    [[unroll]] for (uint e = 0; e < h.length(); ++e) {
      const float g = acc[j][e];
      h[e] = g / (1.0 + exp(-g)) * acc[TN + j][e];
    }
    if (f0 + 16 <= p.M && n + CM_N <= p.N && p.M % 8 == 0) {
      coopMatStoreNV(fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_N>(h), out16, n * p.M + f0, p.M, true);
      continue;
    }
    coopMatStoreNV(h, tile_c, c_base, 16, true);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint e = lane; e < 16 * CM_N; e += 32) {
      const uint row = f0 + e % 16, col = n + e / 16;
      if (row < p.M && col < p.N) out16[col * p.M + row] = float16_t(tile_c[c_base + e]);
    }
    subgroupBarrier();
  }
  return;
#endif
  [[unroll]] for (uint i = 0; i < TM; ++i) {
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      const uint m = m0 + sm * TM * 16 + 16 * i, n = n0 + sn * TN * CM_N + CM_N * j;
      if (m >= p.M || n >= p.N) continue;
      const uint f = i * TN + j;
      if (whole_fragment(m, n)) {
        coopMatStoreNV(acc[f], out_data, o_base + n * p.M + m, p.M, true);
        continue;
      }
      coopMatStoreNV(acc[f], tile_c, c_base, 16, true);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (uint e = lane; e < 16 * CM_N; e += 32) {
        const uint row = m + e % 16, col = n + e / 16;
        if (row >= p.M || col >= p.N) continue;
        const uint o = o_base + col * p.M + row;
        out_data[o] = ACCUMULATE != 0u ? out_data[o] + tile_c[c_base + e] : tile_c[c_base + e];
      }
      subgroupBarrier();
    }
  }
}
