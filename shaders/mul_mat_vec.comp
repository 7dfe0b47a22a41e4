#version 450
// out(ncols, M) = activations(ncols, K) x weights(M, K)^T for few columns (decode): each
// workgroup computes ROWS output rows for every column, its threads striding along K.
#include "common.glsl"
#define A_BINDING 0
#define B_BINDING 1
#include "weights.glsl"
#include "activations.glsl"

#define MAX_COLS 8
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;
layout(push_constant) uniform Params { uint M; uint K; uint ncols; } p;
layout(binding = 2) writeonly buffer Out { float out_data[]; };

// One partial sum per (row, column, subgroup); subgroups are at least 4 wide.
shared float partials[ROWS * MAX_COLS * (gl_WorkGroupSize.x / 4)];

void main() {
  uint row0 = flat_group() * ROWS;
  uint tid = gl_LocalInvocationIndex;
  float acc[ROWS][MAX_COLS];
  for (uint r = 0; r < ROWS; ++r)
    for (uint c = 0; c < MAX_COLS; ++c) acc[r][c] = 0.0;

  uint quads = (p.K + 3) / 4;
  for (uint q = tid; q < quads; q += gl_WorkGroupSize.x) {
    vec4 x[MAX_COLS];
    for (uint c = 0; c < MAX_COLS; ++c) {
      if (c < p.ncols) x[c] = load_b4(c, q, p.K);
    }
    for (uint r = 0; r < ROWS; ++r) {
      if (row0 + r >= p.M) break;
      vec4 a = load_a4(row0 + r, q, p.K);
      for (uint c = 0; c < MAX_COLS; ++c) {
        if (c < p.ncols) acc[r][c] += dot(a, x[c]);
      }
    }
  }

  for (uint r = 0; r < ROWS; ++r) {
    for (uint c = 0; c < MAX_COLS; ++c) {
      if (c >= p.ncols) break;
      float s = subgroupAdd(acc[r][c]);
      if (subgroupElect()) partials[(r * MAX_COLS + c) * (gl_WorkGroupSize.x / 4) + gl_SubgroupID] = s;
    }
  }
  barrier();
  if (tid < ROWS * MAX_COLS) {
    uint r = tid / MAX_COLS, c = tid % MAX_COLS;
    if (c < p.ncols && row0 + r < p.M) {
      float s = 0.0;
      for (uint g = 0; g < gl_NumSubgroups; ++g) s += partials[tid * (gl_WorkGroupSize.x / 4) + g];
      out_data[c * p.M + row0 + r] = s;
    }
  }
}
