#version 450
// Rotary position embedding of x(tokens, heads, head_dim) at positions[token]: pair i of the
// first n_dims dimensions turns by pos * freq_scale * base^(-2i / n_dims). Normal layout pairs
// (2i, 2i + 1); NeoX layout pairs (i, i + n_dims / 2). Dimensions past n_dims are copied.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Params {
  uint head_dim; uint n_dims; uint heads; uint tokens; float freq_base; float freq_scale; uint neox;
} p;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int positions[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };

void main() {
  uint i = gl_GlobalInvocationID.x;  // pair index within the head, or a copied dimension
  uint row = gl_WorkGroupID.z * gl_NumWorkGroups.y + gl_WorkGroupID.y;
  if (row >= p.tokens * p.heads || i >= p.head_dim / 2) return;
  uint token = row / p.heads;
  uint base = row * p.head_dim;
  if (2 * i >= p.n_dims) {
    out_data[base + 2 * i] = x[base + 2 * i];
    out_data[base + 2 * i + 1] = x[base + 2 * i + 1];
    return;
  }
  float theta = float(positions[token]) * p.freq_scale * pow(p.freq_base, -2.0 * float(i) / float(p.n_dims));
  float c = cos(theta), s = sin(theta);
  uint i0 = p.neox != 0 ? i : 2 * i;
  uint i1 = p.neox != 0 ? i + p.n_dims / 2 : 2 * i + 1;
  float x0 = x[base + i0], x1 = x[base + i1];
  out_data[base + i0] = x0 * c - x1 * s;
  out_data[base + i1] = x0 * s + x1 * c;
}
