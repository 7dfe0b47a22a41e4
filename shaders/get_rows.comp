#version 450
// Embedding gather: out(n_ids, K) = weights[ids[i]] dequantized to F32.
#include "common.glsl"
#define A_BINDING 0
#include "weights.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Params { uint K; uint n_ids; } p;
layout(binding = 1) readonly buffer Ids { uint ids[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };

void main() {
  uint q = gl_GlobalInvocationID.x, i = gl_WorkGroupID.y;
  if (4 * q >= p.K || i >= p.n_ids) return;
  vec4 v = load_a4(ids[i], q, p.K);
  for (uint j = 0; j < 4; ++j) {
    if (4 * q + j < p.K) out_data[i * p.K + 4 * q + j] = v[j];
  }
}
