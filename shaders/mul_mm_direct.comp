#version 450
// out(N, M) = activations(N, K) x weights(M, K)^T on tensor cores for decode batches (9 to 64
// columns), with nothing staged in shared memory: each invocation reads and dequantizes the
// weights of its own fragment elements straight into registers, and reads its own activation
// elements with 8-byte loads (they stay in L1: every subgroup of an SM reads the same few KiB).
// The staged kernel (mul_mm_staged.comp) writes every weight to shared memory, waits at a
// barrier and loads it back as fragments; at these widths those loads and barriers, not the
// weights' bytes, bound it (bench/results/staged-rows-2026-11-26-h100.md).
//
// Building fragments element by element needs to know which elements an invocation holds. That is
// the driver's choice; this kernel assumes NVIDIA's (gpu/fragment_layout.hpp: invocation l = 4 g + t
// holds A elements (g or g + 8, 2t + {0, 1} or 2t + 8 + {0, 1}) and B elements (g or g + 8,
// 2t + {0, 1})), and the host runs it only where shaders/coopmat_layout.comp found exactly that.
//
// The order of K inside a product does not matter as long as A and B agree, so the 16 K of each
// of a block's two fragments (h = 0, 1) are permuted to suit the GGUF blocks and the loads: logical
// K 2u + i of fragment h (u < 4, i < 2) is K 16 i + 4u + 2h of the block, and 2u + i + 8 is that
// + 1. Then an invocation (t) holds A's K 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3 of its two rows
// (for Q4_0 the low and high nibbles of quant bytes 4t .. 4t + 3; for Q8_0 and F16 two 4-weight
// runs), and B's K 16 (g % 2) + 4 (g / 2) .. + 3 of its two columns (one 8-byte load each).
//
// A subgroup owns TM 16-row fragments and every column (TN fragments of 8); the SG_K subgroups of a
// workgroup take consecutive shares of K for the same rows and add their sums through shared
// memory at the end. Grid: x row tiles of 16 TM rows, y 1, z > 1 splits K further as the staged
// kernel does (slice z of out, added up by sum_splits.comp). ACCUMULATE: out += the product.
// The host guarantees: that layout, subgroups of 32, K % 32 == 0, activations F16 with 8 TN
// columns (the pad zero), 8-byte aligned buffer offsets.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

const uint TM = SHAPE_TM;      // 16-row fragments a subgroup
const uint TN = SHAPE_TN;      // 8-column fragments: every column of the product
const uint SG_K = SHAPE_SG_K;  // subgroups a workgroup, each a share of K
const uint DEPTH = SHAPE_DEPTH;  // blocks of weights in flight: a ring of registers, refilled as used
layout(local_size_x = 32 * SG_K) in;
layout(constant_id = 5) const uint ACCUMULATE = 0;
layout(push_constant) uniform Params { uint M; uint K; uint N; } p;

layout(binding = 1) readonly buffer Acts { uvec2 b2[]; };  // F16, 4 to an 8-byte word
layout(binding = 2) buffer Out { float out_data[]; };

const uint BM = 16 * TM;
const uint BN = 8 * TN;
#if SHAPE_SG_K * SHAPE_TM * SHAPE_TN * 512 > 49152
#error "the workgroup's sums do not fit in 48 KiB of shared memory"
#endif
shared float sums[SG_K * BM * BN];  // [subgroup][column][row]

#if defined(A_F16)
layout(binding = 0) readonly buffer W { uvec2 w2[]; };  // 4 weights to an 8-byte word
const uint RAW = 4;  // 32-bit words an invocation loads a row and block
#else
layout(binding = 0) readonly buffer W { uint16_t w16[]; };
#if defined(A_Q4_0)
const uint BLOCK_HALFWORDS = 9;
const uint RAW = 3;  // the scale, quant bytes 4t .. 4t + 3 as two halfwords
#else
const uint BLOCK_HALFWORDS = 17;
const uint RAW = 5;  // the scale, quant bytes 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3
#endif
#endif

// This invocation's words of block b of row `row` (what dequantize() takes).
void load_row_block(uint row, uint b, uint t, out uint raw[RAW]) {
#if defined(A_F16)
  const uint w = (row * p.K + 32 * b + 4 * t) / 4;
  const uvec2 lo = w2[w], hi = w2[w + 4];
  raw[0] = lo.x;
  raw[1] = lo.y;
  raw[2] = hi.x;
  raw[3] = hi.y;
#else
  const uint h0 = BLOCK_HALFWORDS * (row * (p.K / 32) + b);
  raw[0] = uint(w16[h0]);
  raw[1] = uint(w16[h0 + 1 + 2 * t]);
  raw[2] = uint(w16[h0 + 2 + 2 * t]);
#if defined(A_Q8_0)
  raw[3] = uint(w16[h0 + 9 + 2 * t]);
  raw[4] = uint(w16[h0 + 10 + 2 * t]);
#endif
#endif
}

// The invocation's eight weights of a row, as F16 pairs: w[0][p] K 4t + 2p, + 1; w[1][p] K
// 16 + 4t + 2p, + 1. Times `keep` (0 past the subgroup's share, whose loads were of a block it does
// not own).
void dequantize(uint raw[RAW], float16_t keep, out f16vec2 w[2][2]) {
#if defined(A_F16)
  [[unroll]] for (uint h = 0; h < 2; ++h) {
    w[h][0] = unpackFloat2x16(raw[2 * h]) * keep;
    w[h][1] = unpackFloat2x16(raw[2 * h + 1]) * keep;
  }
#else
  const float16_t d = uint16BitsToFloat16(uint16_t(raw[0])) * keep;
#if defined(A_Q4_0)
  const uint x = raw[1] | (raw[2] << 16);  // quant bytes 4t .. 4t + 3
  // Nibble pairs in the mantissas of two halves of 1024.0, then (q - 8) * d.
  const uint pairs[4] = uint[4]((x & 0xFu) | ((x << 8) & 0xF0000u), ((x >> 16) & 0xFu) | ((x >> 8) & 0xF0000u),
                                ((x >> 4) & 0xFu) | ((x << 4) & 0xF0000u), ((x >> 20) & 0xFu) | ((x >> 12) & 0xF0000u));
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    w[i / 2][i % 2] = (unpackFloat2x16(pairs[i] | 0x64006400u) - float16_t(1032.0)) * d;
  }
#else
  // Byte pairs, biased by 128, in the mantissas of two halves of 1024.0, then q * d.
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uint x = raw[1 + i];
    const uint pair = (((x & 0xFFu) | ((x << 8) & 0xFF0000u)) ^ 0x00800080u) | 0x64006400u;
    w[i / 2][i % 2] = (unpackFloat2x16(pair) - float16_t(1152.0)) * d;
  }
#endif
#endif
}

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, g = lane / 4, t = lane % 4;
  const uint m0 = gl_WorkGroupID.x * BM;
  // Grid z's slice of the blocks, then this subgroup's share of it.
  const uint blocks = p.K / 32, splits = gl_NumWorkGroups.z, per_split = (blocks + splits - 1) / splits;
  const uint z_begin = min(gl_WorkGroupID.z * per_split, blocks), z_end = min(z_begin + per_split, blocks);
  const uint per_sg = (z_end - z_begin + SG_K - 1) / SG_K;
  const uint b_begin = min(z_begin + sg * per_sg, z_end), b_end = min(b_begin + per_sg, z_end);

  // The rows this invocation loads: g and g + 8 of each fragment (clamped; rows past M are
  // computed and never written).
  uint rows[2 * TM];
  [[unroll]] for (uint i = 0; i < 2 * TM; ++i) rows[i] = min(m0 + 16 * (i / 2) + 8 * (i % 2) + g, p.M - 1);

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> acc[TM * TN];
  [[unroll]] for (uint f = 0; f < TM * TN; ++f) acc[f] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);

  // The weights come from memory, so each subgroup keeps DEPTH blocks' loads in flight: slot d of
  // the ring holds block b0 + d; once used it is refilled with block b0 + d + DEPTH (a block past
  // the share loads the share's last one and is multiplied by zero). The activations, read by every
  // subgroup of the SM, come from L1 as each block is used.
  uint raw[DEPTH][2 * TM][RAW];
  [[unroll]] for (uint d = 0; d < DEPTH; ++d) {
    const uint b = min(b_begin + d, max(b_end, 1u) - 1);
    [[unroll]] for (uint i = 0; i < 2 * TM; ++i) load_row_block(rows[i], b, t, raw[d][i]);
  }
  for (uint b0 = b_begin; b0 < b_end; b0 += DEPTH) {
    [[unroll]] for (uint d = 0; d < DEPTH; ++d) {
      const float16_t keep = b0 + d < b_end ? float16_t(1.0) : float16_t(0.0);
      const uint b = min(b0 + d, b_end - 1);
      const uint k_at = 32 * b + 16 * (g % 2) + 4 * (g / 2);
      uvec2 acts[TN][2];  // columns 8 j + 2t and 8 j + 2t + 1: K 16 (g % 2) + 4 (g / 2) .. + 3
      [[unroll]] for (uint j = 0; j < TN; ++j) {
        [[unroll]] for (uint c = 0; c < 2; ++c) acts[j][c] = b2[((8 * j + 2 * t + c) * p.K + k_at) / 4];
      }
      f16vec2 w[2 * TM][2][2];  // rows g and g + 8 of each fragment
      [[unroll]] for (uint i = 0; i < 2 * TM; ++i) dequantize(raw[d][i], keep, w[i]);
      const uint next = min(b0 + d + DEPTH, b_end - 1);
      [[unroll]] for (uint i = 0; i < 2 * TM; ++i) load_row_block(rows[i], next, t, raw[d][i]);
      [[unroll]] for (uint h = 0; h < 2; ++h) {
        // B element e: logical K g + 8 (e / 2) (block K 16 (g % 2) + 4 (g / 2) + 2h + e / 2),
        // column 2t + e % 2.
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> bf[TN];
        [[unroll]] for (uint j = 0; j < TN; ++j) {
          const f16vec2 c0 = unpackFloat2x16(h == 0 ? acts[j][0].x : acts[j][0].y);
          const f16vec2 c1 = unpackFloat2x16(h == 0 ? acts[j][1].x : acts[j][1].y);
          bf[j][0] = c0.x;
          bf[j][1] = c1.x;
          bf[j][2] = c0.y;
          bf[j][3] = c1.y;
        }
        // A element e: row g + 8 (e / 4), logical K 2t + e % 2 + 8 ((e / 2) % 2), that is block K
        // 16 (e % 2) + 4t + 2h + (e / 2) % 2.
        [[unroll]] for (uint i = 0; i < TM; ++i) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
          [[unroll]] for (uint r = 0; r < 2; ++r) {
            const f16vec2 low = w[2 * i + r][0][h], high = w[2 * i + r][1][h];
            a[4 * r + 0] = low.x;
            a[4 * r + 1] = high.x;
            a[4 * r + 2] = low.y;
            a[4 * r + 3] = high.y;
          }
          [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] = coopMatMulAddNV(a, bf[j], acc[i * TN + j]);
        }
      }
    }
  }

  // The subgroups' sums through shared memory, added in subgroup order, each output written once.
  [[unroll]] for (uint i = 0; i < TM; ++i) {
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      coopMatStoreNV(acc[i * TN + j], sums, sg * BM * BN + 8 * j * BM + 16 * i, BM, true);
    }
  }
  barrier();
  const uint o_base = gl_WorkGroupID.z * p.N * p.M;
  for (uint u = gl_LocalInvocationIndex; u < BM * BN; u += 32 * SG_K) {
    const uint m = m0 + u % BM, n = u / BM;
    if (m >= p.M || n >= p.N) continue;
    float s = 0.0;
    [[unroll]] for (uint k = 0; k < SG_K; ++k) s += sums[k * BM * BN + u];
    const uint o = o_base + n * p.M + m;
    out_data[o] = ACCUMULATE != 0u ? out_data[o] + s : s;
  }
}
