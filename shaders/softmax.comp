#version 450
// out[r] = softmax(x[r] * scale), one workgroup per row.
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x_id = 0) in;
layout(push_constant) uniform Params { uint n; uint rows; float scale; } p;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { float out_data[]; };

void main() {
  uint row = flat_group();
  if (row >= p.rows) return;
  uint base = row * p.n;
  float m = -1.0 / 0.0;
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) m = max(m, x[base + i] * p.scale);
  m = workgroup_max(m);
  float s = 0.0;
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) s += exp(x[base + i] * p.scale - m);
  float inv = 1.0 / workgroup_sum(s);
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x)
    out_data[base + i] = exp(x[base + i] * p.scale - m) * inv;
}
