#version 450
// One sequence's attention block in one dispatch: a decode step of one token with Q4_0 or Q8_0
// weights (A_Q4_0 / A_Q8_0, the same type for q, k, v and the output), no biases, no q/k norms,
// the normal rotary layout (pairs 2i, 2i + 1):
//   a = rmsnorm(x) * norm weight;  q, k, v = wq . a, wk . a, wv . a, q and k turned by the rotary
//   embedding at the token's position, k and v written to the cache (F16) at its slot;
//   x += wo . attention(q, the cache up to and with the token)
// with the products' activations as int8 blocks of 32, as the separate path rounds them. The
// separate path takes five dispatches for this (norm and quantize, q/k/v side by side, attention's
// split and merge, the output product), each after a barrier that drains the GPU, for 8 us of
// weight bytes a layer of llama3-8b.
//
// The grid is persistent (decode_grid.glsl), three phases with two grid barriers (sync words
// push.sync_slot and + 1):
//   1. each workgroup normalises and quantizes x into shared memory, then takes its share of the
//      row pairs of q, k and v (an item: two rows, turned together), writing q to q_out and k, v
//      into the cache (all coherent: other workgroups read them in phase 2);
//   2. the keys 0 .. pos are cut into push.splits ranges; an item is a (KV head, range), which a
//      workgroup attends with attention_tile.glsl for the HG query heads of that KV head, writing
//      a partial softmax; the workgroup that finishes a KV head's last range (a counter a KV head,
//      sync words push.sync_slot + 2 ..) merges its ranges into attn_out;
//   3. each workgroup quantizes attn_out into shared memory, then takes its share of the rows of
//      the output product: x[r] += wo[r] . attn_out.
// Off by default (ops::attn_decode_applies): on the H100 no faster than the five dispatches alone
// and slower inside a step. Of its 48 us a layer alone, 13 are the norm, the two barriers and phase
// 2's bookkeeping with no product or attention at all, ~9 the attention (128 threads of each
// workgroup, a latency chain between two barriers), and q/k/v and wo stream at ~0.9 TB/s against
// 1.4 in their own dispatches (bench/results/ffn-decode-2026-11-27-h100.md).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint MAX_K = 4096;  // the longer of n_embd and heads * D, rounded up to 32
layout(constant_id = 2) const uint D = 128;       // head dimension: 16, 32, 64 or 128
layout(constant_id = 3) const uint HG = 4;        // query heads a KV head serves

layout(push_constant) uniform Params {
  uint n_embd;
  uint kv_heads;
  float eps;
  uint pos;        // the token's position: it attends keys 0 .. pos
  uint slot;       // its row in the cache
  uint table_row;  // where its sequence's block table starts in block_table
  uint page_size;
  uint n_dims;     // rotary dimensions of a head
  float freq_base;
  float freq_scale;
  float scale;     // of the scores
  uint splits;     // key ranges of phase 2
  uint chunks_qkv;
  uint chunks_out;
  uint sync_slot;
} p;

layout(binding = 0) readonly buffer WQ { uint16_t w_q[]; };
layout(binding = 1) readonly buffer WK { uint16_t w_k[]; };
layout(binding = 2) readonly buffer WV { uint16_t w_v[]; };
layout(binding = 3) readonly buffer WO { uint16_t w_o[]; };
layout(binding = 4) buffer X { float x[]; };
layout(binding = 4) buffer X4 { vec4 x4[]; };
layout(binding = 5) readonly buffer NormW { vec4 nw4[]; };
layout(binding = 6) coherent buffer KCache { uvec2 k_cache[]; };  // (slots, kv_heads, D) F16
layout(binding = 6) coherent buffer KCacheH { float16_t k_cache_h[]; };
layout(binding = 7) coherent buffer VCache { uvec2 v_cache[]; };
layout(binding = 7) coherent buffer VCacheH { float16_t v_cache_h[]; };
layout(binding = 8) readonly buffer Tables { uint block_table[]; };
layout(binding = 9) coherent buffer QOut { float q_out[]; };  // heads * D, turned
layout(binding = 9) coherent buffer QOut4 { vec4 q_out4[]; };
// (heads, splits, D) un-normalised outputs, then (heads, splits) (max, sum of exponentials)
layout(binding = 10) coherent buffer Partials { float partials[]; };
layout(binding = 11) coherent buffer AttnOut { float attn_out[]; };  // heads * D
layout(binding = 11) coherent buffer AttnOut4 { vec4 attn_out4[]; };
#define SYNC_BINDING 12

#include "decode_grid.glsl"
#include "attention_tile.glsl"
#include "rope_turn.glsl"

shared bool last_sh;

uint q_rows() { return p.kv_heads * HG * D; }
uint kv_rows() { return p.kv_heads * D; }

float q_unit(uint row, uint u, uint K) UNIT_DOT(w_q)
float k_unit(uint row, uint u, uint K) UNIT_DOT(w_k)
float v_unit(uint row, uint u, uint K) UNIT_DOT(w_v)
float o_unit(uint row, uint u, uint K) UNIT_DOT(w_o)

// Rows 2i and 2i + 1 of q, k and v stacked (q_rows + 2 kv_rows of them): unit u of each.
float qkv_unit(uint r, uint u, uint K) {
  if (r < q_rows()) return q_unit(r, u, K);
  if (r < q_rows() + kv_rows()) return k_unit(r - q_rows(), u, K);
  return v_unit(r - q_rows() - kv_rows(), u, K);
}
float pair_first(uint pair, uint u, uint K) { return qkv_unit(2 * pair, u, K); }
float pair_second(uint pair, uint u, uint K) { return qkv_unit(2 * pair + 1, u, K); }

// Pair `pair` of the stacked rows: q and k turned, q to q_out, k and v into the cache.
void put_pair(uint pair, float s0, float s1) {
  uint r = 2 * pair;
  const bool is_q = r < q_rows(), is_k = !is_q && r < q_rows() + kv_rows();
  if (!is_q) r -= q_rows();
  if (!is_q && !is_k) r -= kv_rows();
  const uint i = (r % D) / 2;
  if ((is_q || is_k) && 2 * i < p.n_dims) {
    const vec2 turned = rope_turn(s0, s1, int(p.pos), i, p.n_dims, p.freq_base, p.freq_scale);
    s0 = turned.x;
    s1 = turned.y;
  }
  if (is_q) {
    q_out[r] = s0;
    q_out[r + 1] = s1;
  } else if (is_k) {
    k_cache_h[p.slot * kv_rows() + r] = float16_t(s0);
    k_cache_h[p.slot * kv_rows() + r + 1] = float16_t(s1);
  } else {
    v_cache_h[p.slot * kv_rows() + r] = float16_t(s0);
    v_cache_h[p.slot * kv_rows() + r + 1] = float16_t(s1);
  }
}
DEFINE_PAIR_PRODUCT(qkv_product, pair_first, pair_second, put_pair)
DEFINE_RESIDUAL_PRODUCT(out_product, o_unit)

// Merges the ranges of KV head kvh's query heads into attn_out (as attention_combine.comp does).
void merge(uint kvh) {
  const uint heads = p.kv_heads * HG, ml = heads * p.splits * D;
  for (uint i = gl_LocalInvocationIndex; i < HG * D; i += gl_WorkGroupSize.x) {
    const uint h = kvh * HG + i / D, d = i % D;
    float m = -1.0 / 0.0;
    for (uint s = 0; s < p.splits; ++s) m = max(m, partials[ml + (h * p.splits + s) * 2]);
    float l = 0.0, o = 0.0;
    for (uint s = 0; s < p.splits; ++s) {
      const float w = exp(partials[ml + (h * p.splits + s) * 2] - m);
      l += partials[ml + (h * p.splits + s) * 2 + 1] * w;
      o += partials[(h * p.splits + s) * D + d] * w;
    }
    attn_out[h * D + d] = o / l;
  }
}

void main() {
  const uint tid = gl_LocalInvocationIndex, threads = gl_WorkGroupSize.x;
  const uint heads = p.kv_heads * HG;

  // Phase 1: a = int8(rmsnorm(x) * norm weight); q, k, v.
  put_normed(p.n_embd, p.eps);
  qkv_product((q_rows() + 2 * kv_rows()) / 2, p.n_embd, p.chunks_qkv);
  grid_barrier(p.sync_slot);

  // Phase 2: attention, a (KV head, key range) at a time.
  const uint ctx = p.pos + 1, per = (ctx + p.splits - 1) / p.splits;
  for (uint item = gl_WorkGroupID.x; item < p.kv_heads * p.splits; item += gl_NumWorkGroups.x) {
    const uint kvh = item / p.splits, split = item % p.splits, h0 = kvh * HG;
    const uint begin = min(ctx, split * per), end = min(ctx, begin + per);
    for (uint i = tid; i < HG * C; i += threads) q_sh[i] = q_out4[h0 * C + i] * p.scale;
    attend(kvh, p.kv_heads, p.table_row, p.page_size, begin, end);
    for (uint i = tid; i < HG * C; i += threads) {
      const uint g = i / C, c = i % C, at = ((h0 + g) * p.splits + split) * D + 4 * c;
      const vec4 acc = attend_output(g, c);
      partials[at] = acc.x;
      partials[at + 1] = acc.y;
      partials[at + 2] = acc.z;
      partials[at + 3] = acc.w;
      if (c == 0) {
        const uint ml = heads * p.splits * D + ((h0 + g) * p.splits + split) * 2;
        partials[ml] = m_sh[g];
        partials[ml + 1] = l_sh[g];
      }
    }
    // The last range of a KV head to finish merges them all.
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
    if (tid == 0) {
      const uint done = atomicAdd(sync[p.sync_slot + 2 + kvh], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                                  gl_SemanticsAcquireRelease);
      last_sh = done + 1 == p.splits;
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
    if (last_sh) merge(kvh);
    barrier();
  }
  grid_barrier(p.sync_slot + 1);

  // Phase 3: x += wo . int8(attn_out).
  for (uint u = tid; u < heads * D / 8; u += threads) put_unit(u, attn_out4[2 * u], attn_out4[2 * u + 1]);
  barrier();
  out_product(p.n_embd, heads * D, p.chunks_out);
}
