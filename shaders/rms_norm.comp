#version 450
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, one workgroup per row.
// F16_OUT: out is F16 and the grid runs to p.padded rows, the rows past p.rows zero: the input of
// the tensor-core matmuls, which read whole column tiles (what to_f16 would make of the F32 rows).
// SUM_SPLITS (with F16_OUT): first x[r] += the K slices of the residual product before it
// (binding 3: slice z of row r at z * rows * n + r * n), added in sum_splits.comp's order and
// written back; then the norm of the sum. The product's sum and the next norm in one dispatch.
// ADD_OUT: out += the normed row (Gemma's norm of a block's output, added to the residual).
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x_id = 0) in;
#if defined(SUM_SPLITS)
layout(binding = 0) buffer X { float x[]; };
layout(binding = 0) buffer X4 { vec4 x4[]; };
layout(binding = 3) readonly buffer Parts { float parts[]; };
layout(binding = 3) readonly buffer Parts4 { vec4 parts4[]; };
#else
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#endif
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 1) readonly buffer W4 { vec4 w4[]; };
#if defined(SUM_SPLITS)
layout(push_constant) uniform Params { uint n; uint rows; float eps; uint padded; uint splits; } p;
#elif defined(F16_OUT)
layout(push_constant) uniform Params { uint n; uint rows; float eps; uint padded; } p;
#else
layout(push_constant) uniform Params { uint n; uint rows; float eps; } p;
#endif
#if defined(F16_OUT)
layout(binding = 2) writeonly buffer Out { float16_t out_data[]; };
layout(binding = 2) writeonly buffer Out4 { f16vec4 out4[]; };
#define STORE(i, v) out_data[i] = float16_t(v)
#define STORE4(i, v) out4[i] = f16vec4(v)
#elif defined(ADD_OUT)
layout(binding = 2) buffer Out { float out_data[]; };
layout(binding = 2) buffer Out4 { vec4 out4[]; };
#define STORE(i, v) out_data[i] += (v)
#define STORE4(i, v) out4[i] += (v)
#else
layout(binding = 2) writeonly buffer Out { float out_data[]; };
layout(binding = 2) writeonly buffer Out4 { vec4 out4[]; };
#define STORE(i, v) out_data[i] = (v)
#define STORE4(i, v) out4[i] = (v)
#endif

// Element i of x (LOAD) or quad i (LOAD4) as the norm reads it: with SUM_SPLITS the sum, written
// back (the invocation that writes an element reads it again below, in program order).
#if defined(SUM_SPLITS)
float load(uint i) {
  float s = x[i];
  for (uint z = 0; z < p.splits; ++z) s += parts[z * p.rows * p.n + i];
  x[i] = s;
  return s;
}
vec4 load4(uint i) {
  vec4 s = x4[i];
  for (uint z = 0; z < p.splits; ++z) s += parts4[z * (p.rows * p.n / 4) + i];
  x4[i] = s;
  return s;
}
#else
float load(uint i) { return x[i]; }
vec4 load4(uint i) { return x4[i]; }
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
    for (uint i = gl_LocalInvocationIndex; i < n4; i += gl_WorkGroupSize.x) {
      const vec4 v = load4(base4 + i);
      ss += dot(v, v);
    }
    const float scale = inversesqrt(workgroup_sum(ss) / float(p.n) + p.eps);
    for (uint i = gl_LocalInvocationIndex; i < n4; i += gl_WorkGroupSize.x) {
      STORE4(base4 + i, x4[base4 + i] * scale * w4[i]);
    }
    return;
  }
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) {
    const float v = load(base + i);
    ss += v * v;
  }
  float scale = inversesqrt(workgroup_sum(ss) / float(p.n) + p.eps);
  for (uint i = gl_LocalInvocationIndex; i < p.n; i += gl_WorkGroupSize.x) STORE(base + i, x[base + i] * scale * w[i]);
}
