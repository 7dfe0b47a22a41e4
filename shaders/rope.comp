#version 450
// Rotary position embedding of x(tokens, heads, head_dim) at positions[token]: pair i of the
// first n_dims dimensions turns by pos * freqs[i] (the base's frequency, scaled: ops::rope_frequencies),
// cos and sin times mscale. Normal layout pairs (2i, 2i + 1); NeoX layout pairs (i, i + n_dims / 2).
// Dimensions past n_dims are copied.
// With KV_WRITE, one dispatch does what a layer needs between its q/k/v products and attention:
// q(tokens, heads, head_dim) turns in place, and k (turned) and v go as F16 into their cache
// slots (slot = page * page_size + offset, from the host), rows = tokens * (heads + kv_heads).
// SUM_SPLITS (with KV_WRITE): q, k and v are read as the sums of their products' K slices
// (bindings 8, 9, 10; slice z at z * the product's size), added in sum_splits.comp's order, where
// the product split (its count past 1); q's turned sums go to q. The three sums' dispatch and
// barrier go away.
// QK_NORM (with KV_WRITE, not SUM_SPLITS): q and k rows are first RMS-normed over the whole head,
// times q_norm or k_norm (bindings 8, 9; Qwen3's and Gemma's per-head norms), then turned: one
// workgroup a row, each thread some pairs. The two norms' dispatches and barrier go away.
#include "common.glsl"
#include "rope_turn.glsl"
#if defined(QK_NORM)
#include "reduce.glsl"
#endif

layout(local_size_x = 64) in;
#if defined(KV_WRITE)
layout(push_constant) uniform Params {
  uint head_dim; uint n_dims; uint heads; uint tokens; float mscale; uint neox; uint kv_heads;
#if defined(QK_NORM)
  float eps;
#endif
#if defined(SUM_SPLITS)
  uint q_splits; uint k_splits; uint v_splits;
#endif
} p;
layout(binding = 0) buffer Q { float q[]; };
layout(binding = 1) readonly buffer Pos { int positions[]; };
layout(binding = 2) readonly buffer K { float k_new[]; };
layout(binding = 3) readonly buffer V { float v_new[]; };
layout(binding = 4) writeonly buffer KCache { float16_t k_cache[]; };
layout(binding = 5) writeonly buffer VCache { float16_t v_cache[]; };
layout(binding = 6) readonly buffer Slots { uint slots[]; };
layout(binding = 7) readonly buffer Freqs { float freqs[]; };  // (n_dims / 2)
#if defined(QK_NORM)
layout(binding = 8) readonly buffer QNorm { float q_norm[]; };  // (head_dim)
layout(binding = 9) readonly buffer KNorm { float k_norm[]; };  // (head_dim)
#endif
#if defined(SUM_SPLITS)
layout(binding = 8) readonly buffer QParts { float q_parts[]; };
layout(binding = 9) readonly buffer KParts { float k_parts[]; };
layout(binding = 10) readonly buffer VParts { float v_parts[]; };
// Element i of q, k or v: the sum of its slices where the product split, else the product's output.
#define SUMMED(name, splits, size)                                          \
  float load_##name(uint i) {                                               \
    if (splits <= 1) return name##_in(i);                                   \
    float s = 0.0;                                                          \
    for (uint z = 0; z < splits; ++z) s += name##_parts[z * (size) + i];    \
    return s;                                                               \
  }
#else
#define SUMMED(name, splits, size) \
  float load_##name(uint i) { return name##_in(i); }
#endif
float q_in(uint i) { return q[i]; }
float k_in(uint i) { return k_new[i]; }
float v_in(uint i) { return v_new[i]; }
SUMMED(q, p.q_splits, p.tokens * p.heads * p.head_dim)
SUMMED(k, p.k_splits, p.tokens * p.kv_heads * p.head_dim)
SUMMED(v, p.v_splits, p.tokens * p.kv_heads * p.head_dim)
#else
layout(push_constant) uniform Params {
  uint head_dim; uint n_dims; uint heads; uint tokens; float mscale; uint neox;
} p;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int positions[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };
layout(binding = 3) readonly buffer Freqs { float freqs[]; };  // (n_dims / 2)
#endif

#if defined(KV_WRITE)
#define LOAD(j) (is_q ? load_q(base + (j)) : load_k(base + (j)))
#define STORE(j, value) if (is_q) q[base + (j)] = (value); else k_cache[dst + (j)] = float16_t(value)
#else
#define LOAD(j) x[base + (j)]
#define STORE(j, value) out_data[base + (j)] = (value)
#endif
#if defined(QK_NORM)
#define NORMED(j) (LOAD(j) * scale * (is_q ? q_norm[j] : k_norm[j]))
#else
#define NORMED(j) LOAD(j)
#endif

// Pair i of the row at `base` (of token `token`): turned, or past n_dims copied; a k row's thread
// also copies v's dimensions 2i and 2i + 1 (dst: the row's cache slot). scale: QK_NORM's.
void turn(uint i, uint token, uint base, uint dst, bool is_q, float scale) {
#if defined(KV_WRITE)
  if (!is_q) {  // v is copied as it is, two dimensions per thread
    v_cache[dst + 2 * i] = float16_t(load_v(base + 2 * i));
    v_cache[dst + 2 * i + 1] = float16_t(load_v(base + 2 * i + 1));
  }
#endif
  if (2 * i >= p.n_dims) {
    float a = NORMED(2 * i), b = NORMED(2 * i + 1);
    STORE(2 * i, a);
    STORE(2 * i + 1, b);
    return;
  }
  uint i0 = p.neox != 0 ? i : 2 * i;
  uint i1 = p.neox != 0 ? i + p.n_dims / 2 : 2 * i + 1;
  const vec2 turned = rope_turn(NORMED(i0), NORMED(i1), positions[token], freqs[i], p.mscale);
  STORE(i0, turned.x);
  STORE(i1, turned.y);
}

void main() {
  uint row = gl_WorkGroupID.z * gl_NumWorkGroups.y + gl_WorkGroupID.y;
#if defined(KV_WRITE)
  const uint per_token = p.heads + p.kv_heads;
  if (row >= p.tokens * per_token) return;
  const uint token = row / per_token, h = row % per_token;
  const bool is_q = h < p.heads;
  // q: its row in place; k: read from k_new, written to the cache row of the token's slot.
  const uint base = is_q ? (token * p.heads + h) * p.head_dim : (token * p.kv_heads + h - p.heads) * p.head_dim;
  const uint dst = is_q ? 0 : slots[token] * (p.kv_heads * p.head_dim) + (h - p.heads) * p.head_dim;
#else
  if (row >= p.tokens * p.heads) return;
  const uint token = row / p.heads, base = row * p.head_dim, dst = 0;
  const bool is_q = true;
#endif
#if defined(QK_NORM)
  // The whole row read for its norm before any of it is written (workgroup_sum's barriers).
  float ss = 0.0;
  for (uint j = gl_LocalInvocationID.x; j < p.head_dim; j += gl_WorkGroupSize.x) {
    const float a = LOAD(j);
    ss += a * a;
  }
  const float scale = inversesqrt(workgroup_sum(ss) / float(p.head_dim) + p.eps);
  for (uint i = gl_LocalInvocationID.x; i < p.head_dim / 2; i += gl_WorkGroupSize.x) turn(i, token, base, dst, is_q, scale);
#else
  const uint i = gl_GlobalInvocationID.x;  // pair index within the head, or a copied dimension
  if (i < p.head_dim / 2) turn(i, token, base, dst, is_q, 1.0);
#endif
}
