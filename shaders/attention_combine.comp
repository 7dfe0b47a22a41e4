#version 450
// Merges the partial softmaxes of attention_split.comp: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// with M the largest m_s. Empty splits carry m = -inf, l = 0, o = 0. One workgroup per (head, token),
// a thread per dimension (two for head dims past 128).
// With Q8 the output goes to the int8 mat-vec instead (a decode step's output product): its blocks
// of 32 (a head holds whole blocks) quantized as quantize_q8.comp does, in the layout it writes
// (K = heads * D, one column a token), sparing that dispatch. With F16 it goes to the tensor
// cores' product instead, as F16 (tokens, heads * D) with the grid running on to the padded rows
// the product reads, which it writes zero (what to_f16 makes of the F32 output).
#include "common.glsl"
#if defined(Q8)
#define INT8_BLOCKS_OUT 1
#include "int8_blocks.glsl"
#endif

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint D = 128;  // head dimension, at most 256
layout(push_constant) uniform Params { uint heads; uint tokens; uint splits; } p;
layout(binding = 0) readonly buffer Partials { float partials[]; };  // as attention_split.comp writes them
#if defined(Q8)
shared float merged[D];
#elif defined(F16)
layout(binding = 1) writeonly buffer Out { float16_t out_data[]; };  // (padded tokens, heads, D)
#else
layout(binding = 1) writeonly buffer Out { float out_data[]; };      // (tokens, heads, D)
#endif

void main() {
  const uint row = gl_WorkGroupID.y * p.heads + gl_WorkGroupID.x;
#if defined(F16)
  if (gl_WorkGroupID.y >= p.tokens) {  // a padded row
    for (uint d = gl_LocalInvocationIndex; d < D; d += 128) out_data[row * D + d] = float16_t(0.0);
    return;
  }
#endif
  for (uint d = gl_LocalInvocationIndex; d < D; d += 128) {
    const uint ml = p.tokens * p.heads * p.splits * D + row * p.splits * 2;
    float m = -1.0 / 0.0;
    for (uint s = 0; s < p.splits; ++s) m = max(m, partials[ml + 2 * s]);
    float l = 0.0, o = 0.0;
    for (uint s = 0; s < p.splits; ++s) {
      float w = exp(partials[ml + 2 * s] - m);
      l += partials[ml + 2 * s + 1] * w;
      o += partials[(row * p.splits + s) * D + d] * w;
    }
#if defined(Q8)
    merged[d] = o / l;
#elif defined(F16)
    out_data[row * D + d] = float16_t(o / l);
#else
    out_data[row * D + d] = o / l;
#endif
  }
#if defined(Q8)
  barrier();
  // Threads 0 .. D / 8 - 1 take 8 elements each, four threads a block (all of them active).
  const uint t = gl_LocalInvocationIndex;
  if (t < D / 8) {
    const vec4 v0 = vec4(merged[8 * t], merged[8 * t + 1], merged[8 * t + 2], merged[8 * t + 3]);
    const vec4 v1 = vec4(merged[8 * t + 4], merged[8 * t + 5], merged[8 * t + 6], merged[8 * t + 7]);
    write_int8_unit(v0, v1, gl_WorkGroupID.y, p.tokens, p.heads * D, gl_WorkGroupID.x * (D / 8) + t);
  }
#endif
}
