#version 450
// out(N, M) = activations(N, K) x weights(M, K)^T on tensor cores, for decode batches: a few to
// 64 columns (more go to further workgroups along y). VK_NV_cooperative_matrix; built only into
// pipelines on devices that report it, never on lavapipe.
//
// Weights stream from memory once: each workgroup owns SG_M groups of RT tiles of 16 rows over
// the whole of K (SPLIT_K subgroups share a group, each taking every SPLIT_K-th run of U blocks of
// 32, and their sums are added at the end), and every subgroup multiplies its rows by all the
// workgroup's columns, each activation fragment it loads by its RT row tiles. Quantized blocks are dequantized by the subgroup into its own slice of shared memory
// (no workgroup barrier on the way); F16 weights are read by the tensor-core loads directly.
// The activations are F16, padded to whole column tiles (narrow_padded_columns), and come from
// L2 through the tensor-core loads. ACCUMULATE: out += the product (the residual add, fused).
//
// The host guarantees: subgroups of 32, K % 32 == 0, M % 16 == 0 for F16 weights, 16-byte
// aligned buffer offsets.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SG_M = 4;        // row groups per workgroup
layout(constant_id = 2) const uint SPLIT_K = 1;     // subgroups per row group, each a slice of K
layout(constant_id = 3) const uint NTILES = 4;      // CM_N-column tiles per workgroup (CM_K must be 16)
layout(constant_id = 4) const uint U = 2;           // blocks of 32 per subgroup per iteration
layout(constant_id = 5) const uint ACCUMULATE = 0;  // 1: out += the product
layout(constant_id = 6) const uint RT = 1;          // 16-row tiles per row group (at most 4)
layout(push_constant) uniform Params { uint M; uint K; uint N; } p;

layout(binding = 1) readonly buffer Acts { float16_t b16[]; };
layout(binding = 2) buffer Out { float out_data[]; };

#define MAX_TILES (64 / CM_N)
#define MAX_RT 4
const uint SUBGROUPS = SG_M * SPLIT_K;
const uint GROUP_ROWS = 16 * RT;
const uint BN = NTILES * CM_N;

#if defined(A_F16)
layout(binding = 0) readonly buffer W { float16_t w16[]; };
#else
layout(binding = 0) readonly buffer W { uint16_t w16[]; };
// Each subgroup's 16 * RT rows x U blocks, dequantized; the pad keeps rows on different banks.
const uint A_STRIDE = 32 * U + 8;
shared float16_t tile_a[SUBGROUPS * GROUP_ROWS * A_STRIDE];

// Lane `part` (0 or 1) of a row writes half of block b: 16 of its 32 weights, at dst (the block's start).
#if defined(A_Q4_0)
// block of 32 (9 halfwords): f16 d, uint8 qs[16]; x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8)
void dequantize(uint row, uint b, uint part, uint dst) {
  uint h = 9 * (row * (p.K / 32) + b);
  float d = unpackHalf2x16(uint(w16[h])).x;
  for (uint i = 0; i < 4; ++i) {
    uint w = uint(w16[h + 1 + 4 * part + i]);  // qs[j], qs[j + 1] with j = 8 * part + 2i
    uint j = 8 * part + 2 * i;
    tile_a[dst + j] = float16_t(d * (float(w & 15u) - 8.0));
    tile_a[dst + j + 16] = float16_t(d * (float((w >> 4) & 15u) - 8.0));
    tile_a[dst + j + 1] = float16_t(d * (float((w >> 8) & 15u) - 8.0));
    tile_a[dst + j + 17] = float16_t(d * (float(w >> 12) - 8.0));
  }
}
#elif defined(A_Q8_0)
// block of 32 (17 halfwords): f16 d, int8 qs[32]; x[j] = d * qs[j]
void dequantize(uint row, uint b, uint part, uint dst) {
  uint h = 17 * (row * (p.K / 32) + b);
  float d = unpackHalf2x16(uint(w16[h])).x;
  for (uint i = 0; i < 8; ++i) {
    int w = int(uint(w16[h + 1 + 8 * part + i]));
    uint j = 16 * part + 2 * i;
    tile_a[dst + j] = float16_t(d * float((w << 24) >> 24));
    tile_a[dst + j + 1] = float16_t(d * float((w << 16) >> 24));
  }
}
#endif
#endif

// One row tile's 16 x BN sums per subgroup, column-major, for the split-K reduction and the write.
shared float tile_c[SUBGROUPS * 16 * BN];

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint sm = sg % SG_M, sk = sg / SG_M;
  const uint m0 = gl_WorkGroupID.x * GROUP_ROWS * SG_M, row0 = m0 + GROUP_ROWS * sm;
  const uint n0 = gl_WorkGroupID.y * BN;
  const uint blocks = p.K / 32;

  fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> acc[MAX_RT * MAX_TILES];
  for (uint i = 0; i < RT * NTILES; ++i) acc[i] = fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>(0.0);

#if !defined(A_F16)
  const uint a_base = sg * GROUP_ROWS * A_STRIDE;
  const uint part = lane % 2;
#endif
  for (uint b0 = sk * U; b0 < blocks; b0 += U * SPLIT_K) {
#if !defined(A_F16)
    for (uint r = 0; r < RT; ++r) {
      const uint tr = 16 * r + lane / 2;
      // Rows past M read row M - 1 (kept in bounds) and are not written.
      const uint row = min(row0 + tr, p.M - 1);
      for (uint u = 0; u < U; ++u) {
        if (b0 + u < blocks) dequantize(row, b0 + u, part, a_base + tr * A_STRIDE + 32 * u);
      }
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
#endif
    for (uint u = 0; u < U; ++u) {
      const uint b = b0 + u;
      if (b >= blocks) break;
      for (uint h = 0; h < 2; ++h) {
        fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a[MAX_RT];
        for (uint r = 0; r < RT; ++r) {
#if defined(A_F16)
          coopMatLoadNV(a[r], w16, min(row0 + 16 * r, p.M - 16) * p.K + 32 * b + 16 * h, p.K, false);
#else
          coopMatLoadNV(a[r], tile_a, a_base + 16 * r * A_STRIDE + 32 * u + 16 * h, A_STRIDE, false);
#endif
        }
        for (uint j = 0; j < NTILES; ++j) {
          // Each activation fragment is loaded once and used by every row tile.
          fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> bj;
          coopMatLoadNV(bj, b16, (n0 + j * CM_N) * p.K + 32 * b + 16 * h, p.K, true);
          for (uint r = 0; r < RT; ++r) acc[r * NTILES + j] = coopMatMulAddNV(a[r], bj, acc[r * NTILES + j]);
        }
      }
    }
#if !defined(A_F16)
    subgroupBarrier();  // every lane has loaded the tile before it is overwritten
#endif
  }

  // One row tile at a time through shared memory: sum the K slices, write (or add) the tile.
  const uint c_base = sg * 16 * BN;
  for (uint r = 0; r < RT; ++r) {
    for (uint j = 0; j < NTILES; ++j) coopMatStoreNV(acc[r * NTILES + j], tile_c, c_base + j * CM_N * 16, 16, true);
    memoryBarrierShared();
    barrier();
    for (uint i = gl_LocalInvocationIndex; i < SG_M * 16 * BN; i += gl_WorkGroupSize.x) {
      const uint g = i / (16 * BN), mr = i % 16, n = (i / 16) % BN;
      const uint m = m0 + g * GROUP_ROWS + 16 * r + mr, col = n0 + n;
      if (m >= p.M || col >= p.N) continue;
      float s = 0.0;
      for (uint k = 0; k < SPLIT_K; ++k) s += tile_c[((k * SG_M + g) * BN + n) * 16 + mr];
      const uint o = col * p.M + m;
      out_data[o] = ACCUMULATE != 0u ? out_data[o] + s : s;
    }
    barrier();
  }
}
