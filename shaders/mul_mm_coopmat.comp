#version 450
// The tiled matrix multiplication on tensor cores (VK_NV_cooperative_matrix; built only into
// pipelines on devices that report it, never on lavapipe). Four subgroups of 32 each compute a
// 32 x 32 quarter of a 64 x 64 tile from F16 operands staged in shared memory, accumulating in F32.
// CM_M x CM_N x CM_K is the matrix shape the device reports (16x16x16 or 16x8x16).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "common.glsl"
#define A_BINDING 0
#define B_BINDING 1
#include "weights.glsl"
#include "activations.glsl"

#define BM 64
#define BN 64
#define BK 32
#define PAD 8
layout(local_size_x = 128) in;
layout(push_constant) uniform Params { uint M; uint K; uint N; } p;
layout(binding = 2) writeonly buffer Out { float out_data[]; };

shared float16_t tile_a[BM * (BK + PAD)];  // [m][k]
shared float16_t tile_b[BN * (BK + PAD)];  // [n][k]: column-major K x N
shared float tile_c[BN * BM];             // [n][m]: column-major M x N

#define SUB_M (32 / CM_M)
#define SUB_N (32 / CM_N)

void main() {
  uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  uint tid = gl_LocalInvocationIndex;
  uint sg = tid / 32;  // the host requires a subgroup size of 32 for this pipeline
  uint sm = (sg % 2) * 32, sn = (sg / 2) * 32;

  fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> acc[SUB_M * SUB_N];
  for (uint i = 0; i < SUB_M * SUB_N; ++i) acc[i] = fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>(0.0);

  for (uint k0 = 0; k0 < p.K; k0 += BK) {
    for (uint i = tid; i < BM * (BK / 4); i += 128) {
      uint r = i / (BK / 4), qi = i % (BK / 4);
      vec4 v = m0 + r < p.M ? load_a4(m0 + r, k0 / 4 + qi, p.K) : vec4(0.0);
      for (uint j = 0; j < 4; ++j) tile_a[r * (BK + PAD) + qi * 4 + j] = float16_t(v[j]);
    }
    for (uint i = tid; i < BN * (BK / 4); i += 128) {
      uint c = i / (BK / 4), qi = i % (BK / 4);
      vec4 v = n0 + c < p.N ? load_b4(n0 + c, k0 / 4 + qi, p.K) : vec4(0.0);
      for (uint j = 0; j < 4; ++j) tile_b[c * (BK + PAD) + qi * 4 + j] = float16_t(v[j]);
    }
    barrier();
    for (uint kk = 0; kk < BK; kk += CM_K) {
      fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a[SUB_M];
      for (uint i = 0; i < SUB_M; ++i)
        coopMatLoadNV(a[i], tile_a, (sm + i * CM_M) * (BK + PAD) + kk, BK + PAD, false);
      for (uint j = 0; j < SUB_N; ++j) {
        fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> b;
        coopMatLoadNV(b, tile_b, (sn + j * CM_N) * (BK + PAD) + kk, BK + PAD, true);
        for (uint i = 0; i < SUB_M; ++i) acc[i * SUB_N + j] = coopMatMulAddNV(a[i], b, acc[i * SUB_N + j]);
      }
    }
    barrier();
  }
  for (uint i = 0; i < SUB_M; ++i)
    for (uint j = 0; j < SUB_N; ++j)
      coopMatStoreNV(acc[i * SUB_N + j], tile_c, (sn + j * CM_N) * BM + sm + i * CM_M, BM, true);
  barrier();
  for (uint i = tid; i < BM * BN; i += 128) {
    uint m = m0 + i % BM, n = n0 + i / BM;
    if (m < p.M && n < p.N) out_data[n * p.M + m] = tile_c[i];
  }
}
