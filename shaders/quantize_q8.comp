#version 450
// Activations for the int8 mat-vec (mul_mat_vec_blocks.comp with B_Q8): each block of 32 elements
// of each of n columns becomes 32 signed bytes and one float scale, value ~= scale * byte, the
// scale being the block's largest magnitude / 127 (the rounding reference::int8_blocks makes).
// The input is x (PLAIN), rmsnorm(x) * weight (RMSNORM), silu(gate) * up (SILU) or gelu(gate) * up
// (GELU, the tanh form: Gemma's GeGLU), made here so
// that the mat-vec's many workgroups read a quarter of the bytes and do none of this work.
// POST_NORM (with RMSNORM): first x += rmsnorm(a) * post (binding 3 x, read and written; binding 4
// post: Gemma's norm of a block's output and its residual add), then rmsnorm(x) * weight of the new
// x, one workgroup a column: the norm after a block, its add and the next norm's int8 input in one
// dispatch.
// Output: the bytes of every column (n * K bytes, as 32-bit words), then the scales (n * K / 32
// floats) from word n * K / 4. Grid: (ceil(K / 2048), n), POST_NORM (1, n); K a multiple of 32.
#include "common.glsl"
#define INT8_BLOCKS_OUT 1
#include "int8_blocks.glsl"

layout(local_size_x = 256) in;
#if defined(RMSNORM)
layout(push_constant) uniform Params { uint K; float eps; } p;
#else
layout(push_constant) uniform Params { uint K; } p;
#endif
layout(binding = 0) readonly buffer A { vec4 a4[]; };  // x, or the gate
#if defined(RMSNORM) || defined(SILU) || defined(GELU)
layout(binding = 2) readonly buffer B { vec4 b4[]; };  // the norm weight, or up
#endif
#if defined(RMSNORM)
#include "reduce.glsl"
#endif
#if defined(POST_NORM)
layout(binding = 3) buffer X { vec4 x4[]; };
layout(binding = 4) readonly buffer Post { vec4 post4[]; };

// x += rmsnorm(a) * post over column c, then rmsnorm(x) * b as int8 blocks. Each thread keeps to
// its own units (8 elements) throughout: it reads back only what it wrote.
void post_norm_column(uint c, uint tid) {
  const uint row4 = c * (p.K / 4);
  float ss = 0.0;
  for (uint i = tid; i < p.K / 4; i += 256) ss += dot(a4[row4 + i], a4[row4 + i]);
  const float post_rms = inversesqrt(workgroup_sum(ss) / float(p.K) + p.eps);
  float ss_x = 0.0;
  for (uint unit = tid; unit < p.K / 8; unit += 256) {
    for (uint h = 0; h < 2; ++h) {
      const uint i = 2 * unit + h;
      const vec4 v = x4[row4 + i] + a4[row4 + i] * post_rms * post4[i];
      x4[row4 + i] = v;
      ss_x += dot(v, v);
    }
  }
  const float inv_rms = inversesqrt(workgroup_sum(ss_x) / float(p.K) + p.eps);
  // K / 8 is a multiple of 4: the four threads of a block go round together.
  for (uint unit = tid; unit < p.K / 8; unit += 256) {
    const vec4 v0 = x4[row4 + 2 * unit] * inv_rms * b4[2 * unit];
    const vec4 v1 = x4[row4 + 2 * unit + 1] * inv_rms * b4[2 * unit + 1];
    write_int8_unit(v0, v1, c, gl_NumWorkGroups.y, p.K, unit);
  }
}
#endif

void main() {
  const uint c = gl_WorkGroupID.y;
  const uint tid = gl_LocalInvocationIndex;
  const uint row4 = c * (p.K / 4);
#if defined(POST_NORM)
  post_norm_column(c, tid);
  return;
#endif
#if defined(RMSNORM)
  // Every workgroup of the column finds its scale (the column is a few KiB, in L2).
  float ss = 0.0;
  for (uint i = tid; i < p.K / 4; i += 256) ss += dot(a4[row4 + i], a4[row4 + i]);
  const float inv_rms = inversesqrt(workgroup_sum(ss) / float(p.K) + p.eps);
#endif
  // Each thread takes 8 elements, four threads a block; a workgroup 64 blocks.
  const uint unit = gl_WorkGroupID.x * 256 + tid;  // elements 8 * unit .. + 7 of the column
  if (unit >= p.K / 8) return;  // K / 8 is a multiple of 4: the four threads of a block leave together
  vec4 v0 = a4[row4 + 2 * unit], v1 = a4[row4 + 2 * unit + 1];
#if defined(RMSNORM)
  v0 *= inv_rms * b4[2 * unit];
  v1 *= inv_rms * b4[2 * unit + 1];
#elif defined(SILU)
  v0 = v0 / (1.0 + exp(-v0)) * b4[row4 + 2 * unit];
  v1 = v1 / (1.0 + exp(-v1)) * b4[row4 + 2 * unit + 1];
#elif defined(GELU)
  v0 = vec4(gelu_tanh(v0.x), gelu_tanh(v0.y), gelu_tanh(v0.z), gelu_tanh(v0.w)) * b4[row4 + 2 * unit];
  v1 = vec4(gelu_tanh(v1.x), gelu_tanh(v1.y), gelu_tanh(v1.z), gelu_tanh(v1.w)) * b4[row4 + 2 * unit + 1];
#endif
  write_int8_unit(v0, v1, c, gl_NumWorkGroups.y, p.K, unit);
}
