#version 450
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, one workgroup per row.
// F16_OUT: out is F16 and the grid runs to p.padded rows, the rows past p.rows zero: the input of
// the tensor-core matmuls, which read whole column tiles (what to_f16 would make of the F32 rows).
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 1) readonly buffer W4 { vec4 w4[]; };
#if defined(F16_OUT)
layout(push_constant) uniform Params { uint n; uint rows; float eps; uint padded; } p;
layout(binding = 2) writeonly buffer Out { float16_t out_data[]; };
layout(binding = 2) writeonly buffer Out4 { f16vec4 out4[]; };
#define STORE(i, v) out_data[i] = float16_t(v)
#define STORE4(i, v) out4[i] = f16vec4(v)
#else
layout(push_constant) uniform Params { uint n; uint rows; float eps; } p;
layout(binding = 2) writeonly buffer Out { float out_data[]; };
layout(binding = 2) writeonly buffer Out4 { vec4 out4[]; };
#define STORE(i, v) out_data[i] = (v)
#define STORE4(i, v) out4[i] = (v)
#endif

void main() {
  uint row = flat_group();
  uint base = row * p.n;
#if defined(F16_OUT)
  if (row >= p.rows) {
    if (row < p.padded) {
      for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) out_data[base + i] = float16_t(0.0);
    }
    return;
  }
#else
  if (row >= p.rows) return;
#endif
  float ss = 0.0;
  if (p.n % 4 == 0) {  // rows of whole vec4s (every model's): a quarter of the loads, each 16 bytes
    const uint base4 = base / 4, n4 = p.n / 4;
    for (uint i = gl_LocalInvocationIndex; i < n4; i += gl_WorkGroupSize.x) ss += dot(x4[base4 + i], x4[base4 + i]);
    const float scale = inversesqrt(workgroup_sum(ss) / float(p.n) + p.eps);
    for (uint i = gl_LocalInvocationIndex; i < n4; i += gl_WorkGroupSize.x) {
      STORE4(base4 + i, x4[base4 + i] * scale * w4[i]);
    }
    return;
  }
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) ss += x[base + i] * x[base + i];
  float scale = inversesqrt(workgroup_sum(ss) / float(p.n) + p.eps);
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) STORE(base + i, x[base + i] * scale * w[i]);
}
