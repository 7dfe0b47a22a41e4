#version 450
// Writes new keys and values (tokens, kv_heads * head_dim, F32) into their cache slots (F16);
// slot = page * page_size + offset in page, computed by the host from the block tables.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint row; uint tokens; } p;
layout(binding = 0) readonly buffer K { float k_new[]; };
layout(binding = 1) readonly buffer V { float v_new[]; };
layout(binding = 2) writeonly buffer KCache { float16_t k_cache[]; };
layout(binding = 3) writeonly buffer VCache { float16_t v_cache[]; };
layout(binding = 4) readonly buffer Slots { uint slots[]; };

void main() {
  uint i = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (i >= p.row || t >= p.tokens) return;
  uint dst = slots[t] * p.row + i;
  k_cache[dst] = float16_t(k_new[t * p.row + i]);
  v_cache[dst] = float16_t(v_new[t * p.row + i]);
}
