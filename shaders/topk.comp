#version 450
// One round of top-k pre-selection: every chunk of CHUNK candidates of a row yields its k best
// (value, index) pairs in order (larger value first, lower index on ties). The host repeats
// rounds over the survivors until one chunk is left. In the first round the candidates' indices
// are their positions (has_indices = 0); later rounds read them from `in_idx`.
#include "common.glsl"
#include "select.glsl"

#define CHUNK 1024
layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint n; uint rows; uint k; uint has_indices; } p;
layout(binding = 0) readonly buffer InV { float in_v[]; };
layout(binding = 1) readonly buffer InI { uint in_idx[]; };
layout(binding = 2) writeonly buffer OutV { float out_v[]; };
layout(binding = 3) writeonly buffer OutI { uint out_idx[]; };

shared float cand_v[CHUNK];
shared uint cand_i[CHUNK];
shared float red_v[256];
shared uint red_i[256];
shared uint red_pos[256];

void main() {
  uint chunk = gl_WorkGroupID.x, row = gl_WorkGroupID.y, tid = gl_LocalInvocationIndex;
  uint chunks = (p.n + CHUNK - 1) / CHUNK;
  for (uint j = tid; j < CHUNK; j += 256) {
    uint i = chunk * CHUNK + j;
    bool inside = i < p.n;
    cand_v[j] = inside ? in_v[row * p.n + i] : 0.0;
    cand_i[j] = !inside ? NO_INDEX : (p.has_indices != 0 ? in_idx[row * p.n + i] : i);
  }
  barrier();
  for (uint r = 0; r < p.k; ++r) {
    float v = 0.0;
    uint idx = NO_INDEX, pos = 0;
    for (uint j = tid; j < CHUNK; j += 256) {
      if (better(cand_v[j], cand_i[j], v, idx)) { v = cand_v[j]; idx = cand_i[j]; pos = j; }
    }
    red_v[tid] = v; red_i[tid] = idx; red_pos[tid] = pos;
    barrier();
    for (uint s = 128; s > 0; s /= 2) {
      if (tid < s && better(red_v[tid + s], red_i[tid + s], red_v[tid], red_i[tid])) {
        red_v[tid] = red_v[tid + s]; red_i[tid] = red_i[tid + s]; red_pos[tid] = red_pos[tid + s];
      }
      barrier();
    }
    if (tid == 0) {
      uint o = (row * chunks + chunk) * p.k + r;
      out_v[o] = red_v[0];
      out_idx[o] = red_i[0];
      cand_i[red_pos[0]] = NO_INDEX;
    }
    barrier();
  }
}
