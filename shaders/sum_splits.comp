#version 450
// out[i] = sum over z < splits of parts[z * count + i], or out[i] += it (ACCUMULATE): the partial
// products of a matmul whose K was split across workgroups (mul_mm_staged.comp), added in a fixed
// order so that results do not depend on scheduling.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint count; uint splits; uint accumulate; } p;
layout(binding = 0) readonly buffer Parts { float parts[]; };
layout(binding = 1) buffer Out { float out_data[]; };

void main() {
  const uint i = flat_group() * 256 + gl_LocalInvocationIndex;
  if (i >= p.count) return;
  float s = p.accumulate != 0u ? out_data[i] : 0.0;
  for (uint z = 0; z < p.splits; ++z) s += parts[z * p.count + i];
  out_data[i] = s;
}
