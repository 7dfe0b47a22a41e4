#version 450
// Argmax in two passes, so a row of a vocabulary's worth of logits is read by many workgroups
// rather than one (H100, 128,256 logits: one workgroup took ~350 us).
// Pass 1 (default): workgroup (g, r) finds the best of x[r][g * chunk .. (g + 1) * chunk) and
// writes it as (value bits, index) to parts[r * groups + g]; an empty chunk writes NO_INDEX.
// Pass 2 (MERGE): workgroup r picks the best of its row's parts into out_index[r].
// The larger value wins, the lower index on ties: the same answer as one pass, bit for bit.
#include "common.glsl"
#include "select.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint n; uint rows; uint chunk; uint groups; } p;
#if defined(MERGE)
layout(binding = 0) readonly buffer Parts { uvec2 parts[]; };
layout(binding = 1) writeonly buffer Out { uint out_index[]; };
#else
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Parts { uvec2 parts[]; };
#endif

shared float best_v[256];
shared uint best_i[256];

void main() {
  const uint tid = gl_LocalInvocationIndex;
#if defined(MERGE)
  const uint row = flat_group();
  if (row >= p.rows) return;
#else
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
#endif
  float v = 0.0;
  uint idx = NO_INDEX;
#if defined(MERGE)
  for (uint j = tid; j < p.groups; j += 256) {
    const uvec2 part = parts[row * p.groups + j];
    if (better(uintBitsToFloat(part.x), part.y, v, idx)) { v = uintBitsToFloat(part.x); idx = part.y; }
  }
#else
  const uint end = min(p.n, (g + 1) * p.chunk);
  for (uint i = g * p.chunk + tid; i < end; i += 256) {
    const float xi = x[row * p.n + i];
    if (better(xi, i, v, idx)) { v = xi; idx = i; }
  }
#endif
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
  if (tid != 0) return;
#if defined(MERGE)
  out_index[row] = best_i[0];
#else
  parts[row * p.groups + g] = uvec2(floatBitsToUint(best_v[0]), best_i[0]);
#endif
}
