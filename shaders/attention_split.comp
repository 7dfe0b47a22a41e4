#version 450
// Attention for few query tokens over long contexts (flash-decoding). The keys token t sees
// (0 .. pos[t] of its sequence, through the block table as in attention.comp) are cut into
// `splits` ranges, each handled by its own workgroup, so that a decode step fills the GPU. A
// workgroup takes HG query heads that share one KV head, so each K and V row is read once for all
// of them. With one split it writes the output; with more it writes a partial softmax (running
// max, sum of exponentials, un-normalised output) that attention_combine.comp merges.
// F16 (one split only): the output is F16, the tensor cores' input of the product after it, and
// the grid runs on to the padded rows it reads, which get zeros (what to_f16 makes of the output).
// Grid: (heads / HG, tokens, splits). Keys go in tiles of TK: scores with eight threads per pair
// of keys (four per key for head dim 16), each over an eighth of the head dimension (vec4 of f16
// each), then the tile's softmax with one subgroup per head, then values with threads over (head
// dimension / 4, key). Each thread issues all its loads of a tile before it uses them: a decode
// step's workgroups have one or two tiles, so the latency of dependent loads, not bandwidth, is
// what they wait on.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint D = 128;  // head dimension: 16, 32, 64 or 128
layout(constant_id = 1) const uint HG = 1;   // query heads per workgroup, at most 8
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

const uint C = D / 4;     // vec4 chunks per row
const uint NK = 128 / C;  // keys one pass of the value loop covers
const uint TK = 32;       // keys per tile
const uint P = C >= 8 ? 8 : C;  // threads that share one key's score
const uint KPT = TK * P / 128;  // keys a thread scores

shared vec4 q_sh[HG * C];         // scaled queries
shared float s_sh[HG * TK];       // the tile's scores, then their exponentials
shared uint slot_sh[TK];
shared float m_sh[HG], l_sh[HG], corr_sh[HG];
shared vec4 o_sh[HG * NK * C];    // per key subset outputs, summed at the end

vec4 unpack4(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }

void main() {
  const uint h0 = gl_WorkGroupID.x * HG, t = gl_WorkGroupID.y, split = gl_WorkGroupID.z;
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID;
#if defined(F16)
  if (t >= p.tokens) {  // a padded row (the whole workgroup): zeros
    for (uint i = tid; i < HG * C; i += 128) out4[(t * p.heads + h0) * C + i] = f16vec4(0.0);
    return;
  }
#endif
  const uint kvh = h0 / (p.heads / p.kv_heads);
  const uvec2 sp = token_seq_pos[t];
  const uint ctx = sp.y + 1, per = (ctx + p.splits - 1) / p.splits;
  const uint begin = min(ctx, split * per), end = min(ctx, begin + per);
  for (uint i = tid; i < HG * C; i += 128) q_sh[i] = q4[(t * p.heads + h0) * C + i] * p.scale;
  if (tid < HG) {
    m_sh[tid] = -1.0 / 0.0;
    l_sh[tid] = 0.0;
  }
  const uint vc = tid % C, vk = tid / C;  // the value loop's chunk and key subset
  vec4 o[HG];
  for (uint g = 0; g < HG; ++g) o[g] = vec4(0.0);

  for (uint tile = begin; tile < end; tile += TK) {
    if (tid < TK) {
      uint j = tile + tid;
      slot_sh[tid] = j < end ? block_table[sp.x * p.max_pages + j / p.page_size] * p.page_size + j % p.page_size : 0;
    }
    barrier();
    {
      // Scores: P threads per key, each over 1 / P of the head's chunks, and KPT keys a thread, so
      // that each query chunk read from shared memory serves KPT keys; all loads issued before any
      // is used; xor shuffles sum the P parts.
      const uint part_of = tid % P, k0 = (tid / P) * KPT;
      vec4 kv[KPT][C / P];
      [[unroll]] for (uint kk = 0; kk < KPT; ++kk) {
        const bool live = tile + k0 + kk < end;
        const uint row = (slot_sh[k0 + kk] * p.kv_heads + kvh) * C;
        [[unroll]] for (uint j = 0; j < C / P; ++j) kv[kk][j] = live ? unpack4(k_cache[row + part_of + P * j]) : vec4(0.0);
      }
      for (uint g = 0; g < HG; ++g) {
        float s[KPT];
        [[unroll]] for (uint kk = 0; kk < KPT; ++kk) s[kk] = 0.0;
        [[unroll]] for (uint j = 0; j < C / P; ++j) {
          const vec4 qv = q_sh[g * C + part_of + P * j];
          [[unroll]] for (uint kk = 0; kk < KPT; ++kk) s[kk] += dot(qv, kv[kk][j]);
        }
        [[unroll]] for (uint kk = 0; kk < KPT; ++kk) {
          [[unroll]] for (uint m = 1; m < P; m *= 2) s[kk] += subgroupShuffleXor(s[kk], m);
          if (part_of == 0) s_sh[g * TK + k0 + kk] = tile + k0 + kk < end ? s[kk] : -1.0 / 0.0;
        }
      }
    }
    barrier();
    for (uint g = gl_SubgroupID; g < HG; g += gl_NumSubgroups) {
      float mx = -1.0 / 0.0;
      for (uint k = lane; k < TK; k += gl_SubgroupSize) mx = max(mx, s_sh[g * TK + k]);
      float m_old = m_sh[g], m_new = max(m_old, subgroupMax(mx));  // finite: the tile has a key
      float sum = 0.0;
      for (uint k = lane; k < TK; k += gl_SubgroupSize) {
        float e = exp(s_sh[g * TK + k] - m_new);
        s_sh[g * TK + k] = e;
        sum += e;
      }
      sum = subgroupAdd(sum);
      float corr = exp(m_old - m_new);
      if (subgroupElect()) {
        m_sh[g] = m_new;
        l_sh[g] = l_sh[g] * corr + sum;
        corr_sh[g] = corr;
      }
    }
    barrier();
    for (uint g = 0; g < HG; ++g) o[g] *= corr_sh[g];
    // Values: every load of the tile issued before the sums (keys past the end weigh 0).
    vec4 vs[TK / NK];
    [[unroll]] for (uint i = 0; i < TK / NK; ++i) {
      const uint k = vk + i * NK;
      vs[i] = tile + k < end ? unpack4(v_cache[(slot_sh[k] * p.kv_heads + kvh) * C + vc]) : vec4(0.0);
    }
    [[unroll]] for (uint i = 0; i < TK / NK; ++i) {
      const uint k = vk + i * NK;
      if (tile + k < end) for (uint g = 0; g < HG; ++g) o[g] += s_sh[g * TK + k] * vs[i];
    }
    barrier();
  }

  for (uint g = 0; g < HG; ++g) o_sh[(g * NK + vk) * C + vc] = o[g];
  barrier();
  for (uint i = tid; i < HG * C; i += 128) {
    uint g = i / C, c = i % C, row = t * p.heads + h0 + g;
    vec4 acc = vec4(0.0);
    for (uint k = 0; k < NK; ++k) acc += o_sh[(g * NK + k) * C + c];
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
