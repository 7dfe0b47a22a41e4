#version 450
// Attention for few query tokens over long contexts (flash-decoding). The keys token t sees
// (0 .. pos[t] of its sequence, through the block table as in attention.comp) are cut into
// `splits` ranges, each handled by its own workgroup, so that a decode step fills the GPU. A
// workgroup takes HG query heads that share one KV head, so each K and V row is read once for all
// of them. With one split it writes the output; with more it writes a partial softmax (running
// max, sum of exponentials, un-normalised output) that attention_combine.comp merges.
// F16 (one split only): the output is F16, the tensor cores' input of the product after it, and
// the grid runs on to the padded rows it reads, which get zeros (what to_f16 makes of the output).
// Grid: (heads / HG, tokens, splits); the loop over a split's keys is attention_tile.glsl's.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint D = 128;  // head dimension: a multiple of 16, at most 256
layout(constant_id = 1) const uint HG = 1;   // query heads per workgroup, at most 8
// Sliding-window layers: a token sees only the keys of the last WINDOW positions (0: all). Scores
// s become SOFTCAP tanh(s / SOFTCAP) (0: as they are). Each folds away at its default.
layout(constant_id = 2) const uint WINDOW = 0;
layout(constant_id = 3) const float SOFTCAP = 0.0;
layout(push_constant) uniform Params {
  uint heads; uint kv_heads; uint page_size; uint max_pages; uint tokens; float scale; uint splits;
} p;
layout(binding = 0) readonly buffer Q { vec4 q4[]; };                // (tokens, heads, D)
layout(binding = 1) readonly buffer KCache { uvec2 k_cache[]; };     // (slots, kv_heads, D) f16
layout(binding = 2) readonly buffer VCache { uvec2 v_cache[]; };
layout(binding = 3) readonly buffer Tables { uint block_table[]; };  // (sequences, max_pages)
layout(binding = 4) readonly buffer Tokens { uvec2 token_seq_pos[]; };  // (tokens): (seq, pos)
#if defined(F16)
layout(binding = 5) writeonly buffer Out { f16vec4 out4[]; };        // (padded tokens, heads, D)
#define OUT4(v) f16vec4(v)
#else
layout(binding = 5) writeonly buffer Out { vec4 out4[]; };           // (tokens, heads, D)
#define OUT4(v) (v)
#endif
// (tokens, heads, splits, D) un-normalised outputs, then (tokens, heads, splits) (max, sum).
layout(binding = 6) writeonly buffer Partials { float partials[]; };

#include "attention_tile.glsl"

void main() {
  const uint h0 = gl_WorkGroupID.x * HG, t = gl_WorkGroupID.y, split = gl_WorkGroupID.z;
  const uint tid = gl_LocalInvocationIndex;
#if defined(F16)
  if (t >= p.tokens) {  // a padded row (the whole workgroup): zeros
    for (uint i = tid; i < HG * C; i += 128) out4[(t * p.heads + h0) * C + i] = f16vec4(0.0);
    return;
  }
#endif
  const uint kvh = h0 / (p.heads / p.kv_heads);
  const uvec2 sp = token_seq_pos[t];
  const uint ctx = sp.y + 1, first = WINDOW > 0 && ctx > WINDOW ? ctx - WINDOW : 0;
  const uint per = (ctx - first + p.splits - 1) / p.splits;
  const uint begin = min(ctx, first + split * per), end = min(ctx, begin + per);
  for (uint i = tid; i < HG * C; i += 128) q_sh[i] = q4[(t * p.heads + h0) * C + i] * p.scale;
  attend(kvh, p.kv_heads, sp.x * p.max_pages, p.page_size, begin, end);
  for (uint i = tid; i < HG * C; i += 128) {
    uint g = i / C, c = i % C, row = t * p.heads + h0 + g;
    const vec4 acc = attend_output(g, c);
    if (p.splits == 1) {
      out4[row * C + c] = OUT4(acc / l_sh[g]);
      continue;
    }
    uint at = (row * p.splits + split) * D + 4 * c;
    partials[at] = acc.x;
    partials[at + 1] = acc.y;
    partials[at + 2] = acc.z;
    partials[at + 3] = acc.w;
    if (c == 0) {
      uint ml = p.tokens * p.heads * p.splits * D + (row * p.splits + split) * 2;
      partials[ml] = m_sh[g];
      partials[ml + 1] = l_sh[g];
    }
  }
}
