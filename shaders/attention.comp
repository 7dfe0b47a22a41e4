#version 450
// Attention of query tokens over a paged KV cache, for prefill chunks and batched decode alike.
// Token t belongs to sequence seq[t] at position pos[t] and sees keys 0 .. pos[t] of that sequence
// (causal). Key j of a sequence lives in slot block_table[seq][j / page_size] * page_size +
// j % page_size. Query head h reads KV head h / (heads / kv_heads) (grouped-query attention).
// One workgroup per (token, head); keys in chunks of 128 with an online softmax; a thread sums the
// values of one dimension (two for head dims past 128). WINDOW (sliding-window layers): a token
// sees only the keys of the last WINDOW positions, its own included; SOFTCAP: scores s become
// SOFTCAP tanh(s / SOFTCAP) (Gemma 2). Each folds away at its default.
#include "common.glsl"
#include "reduce.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint D = 128;  // head dimension, at most 256
layout(constant_id = 1) const uint WINDOW = 0;     // 0: every key up to the token's own
layout(constant_id = 2) const float SOFTCAP = 0.0;  // 0: scores as they are
const uint DT = (D + 127) / 128;             // dimensions a thread sums
layout(push_constant) uniform Params {
  uint heads; uint kv_heads; uint page_size; uint max_pages; uint tokens; float scale;
} p;
layout(binding = 0) readonly buffer Q { float q[]; };              // (tokens, heads, D)
layout(binding = 1) readonly buffer KCache { float16_t k_cache[]; };  // (slots, kv_heads, D)
layout(binding = 2) readonly buffer VCache { float16_t v_cache[]; };
layout(binding = 3) readonly buffer Tables { uint block_table[]; };  // (sequences, max_pages)
layout(binding = 4) readonly buffer Tokens { uvec2 token_seq_pos[]; };  // (tokens): (seq, pos)
layout(binding = 5) writeonly buffer Out { float out_data[]; };     // (tokens, heads, D)

shared float q_sh[D];
shared float p_sh[128];
shared uint slot_sh[128];

void main() {
  uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationIndex;
  uint kvh = h / (p.heads / p.kv_heads);
  uvec2 sp = token_seq_pos[t];
  uint ctx = sp.y + 1;
  for (uint d = tid; d < D; d += 128) q_sh[d] = q[(t * p.heads + h) * D + d] * p.scale;
  barrier();

  float m = -1.0 / 0.0, l = 0.0, o[DT];
  for (uint r = 0; r < DT; ++r) o[r] = 0.0;
  const uint first = WINDOW > 0 && ctx > WINDOW ? ctx - WINDOW : 0;
  for (uint c0 = first; c0 < ctx; c0 += 128) {
    uint j = c0 + tid;
    float s = -1.0 / 0.0;
    uint slot = 0;
    if (j < ctx) {
      slot = block_table[sp.x * p.max_pages + j / p.page_size] * p.page_size + j % p.page_size;
      uint kb = (slot * p.kv_heads + kvh) * D;
      s = 0.0;
      for (uint d = 0; d < D; ++d) s += q_sh[d] * float(k_cache[kb + d]);
      if (SOFTCAP > 0.0) s = soft_cap(s, SOFTCAP);
    }
    float m_new = max(m, workgroup_max(s));
    float pj = j < ctx ? exp(s - m_new) : 0.0;
    p_sh[tid] = pj;
    slot_sh[tid] = slot;
    float correction = exp(m - m_new);
    l = l * correction + workgroup_sum(pj);  // its barriers publish p_sh and slot_sh
    for (uint r = 0, d = tid; r < DT; ++r, d += 128) {
      if (d >= D) break;
      o[r] *= correction;
      uint n = min(128u, ctx - c0);
      for (uint jj = 0; jj < n; ++jj) o[r] += p_sh[jj] * float(v_cache[(slot_sh[jj] * p.kv_heads + kvh) * D + d]);
    }
    m = m_new;
    barrier();
  }
  for (uint r = 0, d = tid; r < DT && d < D; ++r, d += 128) out_data[(t * p.heads + h) * D + d] = o[r] / l;
}
