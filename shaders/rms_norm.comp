#version 450
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, one workgroup per row.
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x_id = 0) in;
layout(push_constant) uniform Params { uint n; uint rows; float eps; } p;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };

void main() {
  uint row = flat_group();
  if (row >= p.rows) return;
  uint base = row * p.n;
  float ss = 0.0;
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) ss += x[base + i] * x[base + i];
  float scale = inversesqrt(workgroup_sum(ss) / float(p.n) + p.eps);
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) out_data[base + i] = x[base + i] * scale * w[i];
}
