#version 450
// out[r] = the index of the largest x[r][i] (lowest index on ties), one workgroup per row.
#include "common.glsl"
#include "select.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint n; uint rows; } p;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { uint out_index[]; };

shared float best_v[256];
shared uint best_i[256];

void main() {
  uint row = flat_group(), tid = gl_LocalInvocationIndex;
  if (row >= p.rows) return;
  float v = 0.0;
  uint idx = NO_INDEX;
  for (uint i = tid; i < p.n; i += 256) {
    float xi = x[row * p.n + i];
    if (better(xi, i, v, idx)) { v = xi; idx = i; }
  }
  best_v[tid] = v;
  best_i[tid] = idx;
  barrier();
  for (uint s = 128; s > 0; s /= 2) {
    if (tid < s && better(best_v[tid + s], best_i[tid + s], best_v[tid], best_i[tid])) {
      best_v[tid] = best_v[tid + s];
      best_i[tid] = best_i[tid + s];
    }
    barrier();
  }
  if (tid == 0) out_index[row] = best_i[0];
}
