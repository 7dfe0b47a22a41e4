#version 450
// A mixture of experts' routing and sum.
// MOE_ROUTE: each row of router logits (rows, n_expert) gives its `used` experts of highest
// softmax probability (lower index on ties) and their probabilities renormalised to sum to 1,
// which is exp(logit - the top logit) over those experts' sum: (rows, used) ids and weights.
// MOE_COMBINE: x(row, n) += sum over its slots of weight(row, slot) * y(row * used + slot, n).
// MOE_SORT: the step's (token, slot) pairs grouped by expert, for the tiled products
// (mul_mm_id.comp): `order` the pairs expert by expert, `tiles` word 0 the number of tiles, then
// from uvec4 1 each tile's (expert, first position in order, pairs, 0), at most `tile` pairs a
// tile. One workgroup; the order within an expert is any (each pair's output is its own).
#include "common.glsl"

layout(local_size_x = 64) in;
#if defined(MOE_ROUTE)
layout(push_constant) uniform Params { uint n_expert; uint used; uint rows; } p;
layout(binding = 0) readonly buffer Logits { float logits[]; };
layout(binding = 1) writeonly buffer Experts { uint experts[]; };
layout(binding = 2) writeonly buffer Weights { float weights[]; };

const uint NONE = 0xFFFFFFFFu;
shared float values[1024];  // each thread's experts e = tid + 64 i: only that thread reads them
shared bool taken[1024];
shared float group_value[2][64];  // each subgroup's best of a pick, the picks taking the halves in turn
shared uint group_index[2][64];
shared float picked[64];  // exp(logit - top) of each pick, at most 64 a row (ops::moe_route)

// Whether (v, i) ranks before (w, j): value descending, index ascending; NONE ranks last.
bool before(float v, uint i, float w, uint j) { return i != NONE && (j == NONE || v > w || (v == w && i < j)); }

// One workgroup a row, each thread holding the logits of every 64th expert. A pick is each thread's
// best of those not taken, each subgroup's best of those (a max of the values, then the least index
// holding it), and every thread's best of the subgroups' after one barrier: a row costs `used`
// barriers, where a tree of 64 in shared memory cost seven a pick. The thread holding the pick
// marks it taken.
void main() {
  const uint row = flat_group();
  if (row >= p.rows) return;  // the whole workgroup
  const uint tid = gl_LocalInvocationIndex, base = row * p.n_expert;
  for (uint e = tid; e < p.n_expert; e += 64) {
    values[e] = logits[base + e];
    taken[e] = false;
  }
  float top = 0.0, sum = 0.0;
  for (uint j = 0; j < p.used; ++j) {
    float best = 0.0;
    uint pick = NONE;
    for (uint e = tid; e < p.n_expert; e += 64) {
      if (!taken[e] && before(values[e], e, best, pick)) {
        best = values[e];
        pick = e;
      }
    }
    const float group_best = subgroupMax(pick != NONE ? best : uintBitsToFloat(0xFF800000u));  // -inf: none left
    const uint group_pick = subgroupMin(pick != NONE && best == group_best ? pick : NONE);
    if (subgroupElect()) {
      group_value[j % 2][gl_SubgroupID] = group_best;
      group_index[j % 2][gl_SubgroupID] = group_pick;
    }
    barrier();
    best = 0.0;
    pick = NONE;
    for (uint g = 0; g < gl_NumSubgroups; ++g) {
      if (before(group_value[j % 2][g], group_index[j % 2][g], best, pick)) {
        best = group_value[j % 2][g];
        pick = group_index[j % 2][g];
      }
    }
    if (j == 0) top = best;
    const float w = exp(best - top);
    sum += w;
    if (pick % 64 == tid) taken[pick] = true;
    if (tid == 0) {
      picked[j] = w;
      experts[row * p.used + j] = pick;
    }
  }
  if (tid == 0) {
    for (uint j = 0; j < p.used; ++j) weights[row * p.used + j] = picked[j] / sum;
  }
}
#elif defined(MOE_SORT)
layout(push_constant) uniform Params { uint pairs; uint n_expert; uint tile; } p;
layout(binding = 0) readonly buffer Experts { uint experts[]; };
layout(binding = 1) writeonly buffer Order { uint order[]; };
layout(binding = 2) writeonly buffer Tiles { uvec4 tiles[]; };

shared uint counts[1024], next[1024];

void main() {
  uint tid = gl_LocalInvocationIndex;
  for (uint e = tid; e < p.n_expert; e += 64) counts[e] = 0;
  barrier();
  for (uint i = tid; i < p.pairs; i += 64) atomicAdd(counts[experts[i]], 1u);
  barrier();
  if (tid == 0) {
    uint at = 0, count = 0;
    for (uint e = 0; e < p.n_expert; ++e) {
      next[e] = at;
      for (uint c = 0; c < counts[e]; c += p.tile) tiles[1 + count++] = uvec4(e, at + c, min(p.tile, counts[e] - c), 0);
      at += counts[e];
    }
    tiles[0] = uvec4(count, 0, 0, 0);
  }
  barrier();
  for (uint i = tid; i < p.pairs; i += 64) order[atomicAdd(next[experts[i]], 1u)] = i;
}
#elif defined(MOE_COMBINE)
layout(push_constant) uniform Params { uint n; uint used; uint total; } p;
layout(binding = 0) readonly buffer Outputs { float y[]; };
layout(binding = 1) readonly buffer Weights { float weights[]; };
layout(binding = 2) buffer X { float x[]; };

void main() {
  uint i = flat_group() * 64 + gl_LocalInvocationIndex;
  if (i >= p.total) return;
  uint row = i / p.n, col = i % p.n;
  float sum = 0.0;
  for (uint j = 0; j < p.used; ++j) sum += weights[row * p.used + j] * y[(row * p.used + j) * p.n + col];
  x[i] += sum;
}
#endif
