#version 450
// out = a + b (ADD) or out = silu(a) * b (SILU_MUL, a the gate), over n elements.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint n; } p;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };

void main() {
  uint i = flat_group() * 256 + gl_LocalInvocationIndex;
  if (i >= p.n) return;
#if defined(SILU_MUL)
  float g = a[i];
  out_data[i] = g / (1.0 + exp(-g)) * b[i];
#else
  out_data[i] = a[i] + b[i];
#endif
}
