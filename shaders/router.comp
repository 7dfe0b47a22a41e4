#version 450
// A mixture of experts' router in wide steps: logits (rows, n_expert) = x (rows, k) times the
// router's weights (n_expert, k) transposed, k a multiple of 4, n_expert at most 256. A workgroup
// takes TOKENS rows of x, a chunk of k at a time through shared memory; each subgroup takes every
// gl_NumSubgroups-th expert, its lanes striding the chunk in 16-byte loads of F32 weights (8-byte
// ones of F16 or BF16), a subgroup sum per token, and lane i keeps the running sums of the
// subgroup's i-th expert (256 threads: at most subgroup-size experts a subgroup). The weights are
// read once a workgroup and stay in L2; the tiled products walked k in 64 steps of a load, a
// barrier and the sums, this walks it in k / (4 CHUNK) steps with loads independent inside each.
// Define one of A_F32, A_F16, A_BF16.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint n_expert; uint k; uint rows; } p;
#if defined(A_F32)
layout(binding = 0) readonly buffer Weights { vec4 w[]; };
vec4 load_w(uint i) { return w[i]; }
#elif defined(A_F16)
layout(binding = 0) readonly buffer Weights { f16vec4 w[]; };
vec4 load_w(uint i) { return vec4(w[i]); }
#elif defined(A_BF16)
layout(binding = 0) readonly buffer Weights { uvec2 w[]; };
vec4 load_w(uint i) {
  const uvec2 u = w[i];
  return uintBitsToFloat(uvec4(u.x << 16, u.x & 0xFFFF0000u, u.y << 16, u.y & 0xFFFF0000u));
}
#endif
layout(binding = 1) readonly buffer X { vec4 x[]; };
layout(binding = 2) writeonly buffer Logits { float logits[]; };

const uint TOKENS = 4, CHUNK = 256;  // rows of x a workgroup; vec4s of k a chunk (16 KB shared)
shared vec4 xs[TOKENS][CHUNK];

void main() {
  const uint row0 = flat_group() * TOKENS, k4 = p.k / 4, lane = gl_SubgroupInvocationID;
  float acc[TOKENS];
  for (uint t = 0; t < TOKENS; ++t) acc[t] = 0.0;
  for (uint c0 = 0; c0 < k4; c0 += CHUNK) {
    const uint len = min(CHUNK, k4 - c0);
    barrier();  // the previous chunk's reads are done
    for (uint i = gl_LocalInvocationIndex; i < TOKENS * CHUNK; i += gl_WorkGroupSize.x) {
      const uint t = i / CHUNK, q = i % CHUNK;
      xs[t][q] = row0 + t < p.rows && q < len ? x[(row0 + t) * k4 + c0 + q] : vec4(0.0);
    }
    barrier();
    uint slot = 0;
    for (uint e = gl_SubgroupID; e < p.n_expert; e += gl_NumSubgroups, ++slot) {
      const uint base = e * k4 + c0;
      float s[TOKENS];
      for (uint t = 0; t < TOKENS; ++t) s[t] = 0.0;
      for (uint q = lane; q < len; q += gl_SubgroupSize) {
        const vec4 a = load_w(base + q);
        for (uint t = 0; t < TOKENS; ++t) s[t] += dot(a, xs[t][q]);
      }
      for (uint t = 0; t < TOKENS; ++t) {
        const float sum = subgroupAdd(s[t]);
        if (lane == slot) acc[t] += sum;
      }
    }
  }
  const uint e = gl_SubgroupID + lane * gl_NumSubgroups;
  if (e >= p.n_expert) return;
  for (uint t = 0; t < TOKENS && row0 + t < p.rows; ++t) logits[(row0 + t) * p.n_expert + e] = acc[t];
}
