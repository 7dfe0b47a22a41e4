#version 450
// Merges the partial softmaxes of attention_split.comp: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// with M the largest m_s. Empty splits carry m = -inf, l = 0, o = 0. One workgroup per (head, token).
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint D = 128;
layout(push_constant) uniform Params { uint heads; uint tokens; uint splits; } p;
layout(binding = 0) readonly buffer Partials { float partials[]; };  // as attention_split.comp writes them
layout(binding = 1) writeonly buffer Out { float out_data[]; };      // (tokens, heads, D)

void main() {
  const uint row = gl_WorkGroupID.y * p.heads + gl_WorkGroupID.x, d = gl_LocalInvocationIndex;
  if (d >= D) return;
  const uint ml = p.tokens * p.heads * p.splits * D + row * p.splits * 2;
  float m = -1.0 / 0.0;
  for (uint s = 0; s < p.splits; ++s) m = max(m, partials[ml + 2 * s]);
  float l = 0.0, o = 0.0;
  for (uint s = 0; s < p.splits; ++s) {
    float w = exp(partials[ml + 2 * s] - m);
    l += partials[ml + 2 * s + 1] * w;
    o += partials[(row * p.splits + s) * D + d] * w;
  }
  out_data[row * D + d] = o / l;
}
