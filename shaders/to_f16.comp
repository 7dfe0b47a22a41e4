#version 450
// out(padded_rows, n) F16 = in(rows, n) F32, rows past `rows` zero: the activations of the
// tensor-core matmuls, which read whole column tiles.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint count; uint total; } p;  // rows * n, padded_rows * n
layout(binding = 0) readonly buffer In { float in_data[]; };
layout(binding = 1) writeonly buffer Out { float16_t out_data[]; };

void main() {
  uint i = flat_group() * 256 + gl_LocalInvocationIndex;
  if (i >= p.total) return;
  out_data[i] = i < p.count ? float16_t(in_data[i]) : float16_t(0.0);
}
