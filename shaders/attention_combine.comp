#version 450
// Merges the partial softmaxes of attention_split.comp: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// with M the largest m_s. Empty splits carry m = -inf, l = 0, o = 0. One workgroup per (head, token).
// With Q8_OUT it also writes the output quantized as quantize_q8.comp would (the attention output
// product's int8 input), sparing that dispatch: D % 32 == 0, so a head holds whole blocks.
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint D = 128;
layout(push_constant) uniform Params { uint heads; uint tokens; uint splits; } p;
layout(binding = 0) readonly buffer Partials { float partials[]; };  // as attention_split.comp writes them
layout(binding = 1) writeonly buffer Out { float out_data[]; };      // (tokens, heads, D)
#if defined(Q8_OUT)
layout(binding = 2) writeonly buffer Q { uint q_out[]; };            // quantize_q8.comp's layout, K = heads * D
layout(binding = 2) writeonly buffer S { float s_out[]; };
shared float o_sh[D];
#endif

void main() {
  const uint row = gl_WorkGroupID.y * p.heads + gl_WorkGroupID.x, d = gl_LocalInvocationIndex;
  float o = 0.0;
  if (d < D) {
    const uint ml = p.tokens * p.heads * p.splits * D + row * p.splits * 2;
    float m = -1.0 / 0.0;
    for (uint s = 0; s < p.splits; ++s) m = max(m, partials[ml + 2 * s]);
    float l = 0.0;
    for (uint s = 0; s < p.splits; ++s) {
      float w = exp(partials[ml + 2 * s] - m);
      l += partials[ml + 2 * s + 1] * w;
      o += partials[(row * p.splits + s) * D + d] * w;
    }
    o /= l;
    out_data[row * D + d] = o;
  }
#if defined(Q8_OUT)
  if (d < D) o_sh[d] = o;
  barrier();
  if (d >= D || d % 4 != 0) return;
  // Each fourth thread packs its four values; the block's scale from its 32 values in shared memory.
  const uint block = d / 32;
  float amax = 0.0;
  for (uint i = 0; i < 32; ++i) amax = max(amax, abs(o_sh[32 * block + i]));
  const float inv = amax > 0.0 ? 1.0 / amax : 0.0;
  const uint k = p.heads * D, t = gl_WorkGroupID.y, e = gl_WorkGroupID.x * D + d;  // element of the token's row
  q_out[t * (k / 4) + e / 4] = packSnorm4x8(vec4(o_sh[d], o_sh[d + 1], o_sh[d + 2], o_sh[d + 3]) * inv);
  if (d % 32 == 0) s_out[p.tokens * (k / 4) + t * (k / 32) + e / 32] = amax * (1.0 / 127.0);
#endif
}
