#version 450
// out(N, M) = activations(N, K) x weights(M, K)^T for many columns (prefill), tiled: each
// workgroup of 16 x 16 threads computes a BM x BN tile, staging BK-wide slices of both
// operands in shared memory (dequantized to F32).
#include "common.glsl"
#define A_BINDING 0
#define B_BINDING 1
#include "weights.glsl"
#include "activations.glsl"

#define BK 32
layout(local_size_x = 256) in;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(push_constant) uniform Params { uint M; uint K; uint N; } p;
layout(binding = 2) writeonly buffer Out { float out_data[]; };

shared float tile_a[BM * (BK + 1)];
shared float tile_b[BN * (BK + 1)];

void main() {
  uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  uint tid = gl_LocalInvocationIndex;
  uint tm = tid % 16, tn = tid / 16;
  float acc[BM / 16][BN / 16];
  for (uint i = 0; i < BM / 16; ++i)
    for (uint j = 0; j < BN / 16; ++j) acc[i][j] = 0.0;

  for (uint k0 = 0; k0 < p.K; k0 += BK) {
    for (uint i = tid; i < BM * (BK / 4); i += 256) {
      uint r = i / (BK / 4), qi = i % (BK / 4);
      vec4 v = m0 + r < p.M ? load_a4(m0 + r, k0 / 4 + qi, p.K) : vec4(0.0);
      for (uint j = 0; j < 4; ++j) tile_a[r * (BK + 1) + qi * 4 + j] = v[j];
    }
    for (uint i = tid; i < BN * (BK / 4); i += 256) {
      uint c = i / (BK / 4), qi = i % (BK / 4);
      vec4 v = n0 + c < p.N ? load_b4(n0 + c, k0 / 4 + qi, p.K) : vec4(0.0);
      for (uint j = 0; j < 4; ++j) tile_b[c * (BK + 1) + qi * 4 + j] = v[j];
    }
    barrier();
    for (uint kk = 0; kk < BK; ++kk) {
      float a[BM / 16];
      for (uint i = 0; i < BM / 16; ++i) a[i] = tile_a[(tm + 16 * i) * (BK + 1) + kk];
      for (uint j = 0; j < BN / 16; ++j) {
        float b = tile_b[(tn + 16 * j) * (BK + 1) + kk];
        for (uint i = 0; i < BM / 16; ++i) acc[i][j] += a[i] * b;
      }
    }
    barrier();
  }
  for (uint j = 0; j < BN / 16; ++j) {
    uint n = n0 + tn + 16 * j;
    if (n >= p.N) break;
    for (uint i = 0; i < BM / 16; ++i) {
      uint m = m0 + tm + 16 * i;
      if (m < p.M) out_data[n * p.M + m] = acc[i][j];
    }
  }
}
