#version 450
// A mixture of experts' routing and sum.
// MOE_ROUTE: each row of router logits (rows, n_expert) gives its `used` experts of highest
// softmax probability (lower index on ties) and their probabilities renormalised to sum to 1,
// which is exp(logit - the top logit) over those experts' sum: (rows, used) ids and weights.
// MOE_COMBINE: x(row, n) += sum over its slots of weight(row, slot) * y(row * used + slot, n).
// MOE_SORT: the step's (token, slot) pairs grouped by expert, for the tiled products
// (mul_mm_id.comp, mul_mm_staged.comp's EXPERTS): `order` the pairs expert by expert, `tiles` word 0
// the number of tiles, then from uvec4 1 each tile's (expert, first position in order, pairs, 0), at
// most `tile` pairs a tile. The order within an expert is any (each pair's output is its own).
#include "common.glsl"

layout(local_size_x = 64) in;
#if defined(MOE_ROUTE)
layout(push_constant) uniform Params { uint n_expert; uint used; uint rows; } p;
#define ROUTE_LOGITS_BINDING 0
#include "moe_route.glsl"
layout(binding = 1) writeonly buffer Experts { uint experts[]; };
layout(binding = 2) writeonly buffer Weights { float weights[]; };

// One workgroup a row (moe_route.glsl's ranks).
void main() {
  const uint row = flat_group();
  if (row >= p.rows) return;  // the whole workgroup
  route_token(row, p.n_expert, p.used);
  const uint j = gl_LocalInvocationIndex;
  if (j < p.used) {
    experts[row * p.used + j] = route_experts[j];
    weights[row * p.used + j] = route_weights[j];
  }
}
#elif defined(MOE_SORT_COUNT) || defined(MOE_SORT_OFFSETS) || defined(MOE_SORT_SCATTER)
// MOE_SORT in three dispatches (ops::moe_sort): COUNT, a workgroup a chunk of `chunk` pairs, writes
// its count of pairs for each expert into the tiles buffer past the tiles (words `counts` on, chunk
// by chunk); OFFSETS, one workgroup, turns them into where each chunk's pairs of each expert start
// in `order` (experts in turn, chunks in turn within an expert) and writes the tiles; SCATTER, a
// workgroup a chunk again, puts each of its pairs at its expert's next place.
layout(push_constant) uniform Params { uint pairs; uint n_expert; uint tile; uint counts; uint chunk; uint chunks; } p;
layout(binding = 0) readonly buffer Experts { uint experts[]; };
layout(binding = 1) writeonly buffer Order { uint order[]; };
layout(binding = 2) buffer Tiles { uvec4 tiles[]; };
layout(binding = 2) buffer TileWords { uint words[]; };

shared uint counts[1024];
#if defined(MOE_SORT_OFFSETS)
shared uint tile_first[1025];
#endif

void main() {
  const uint tid = gl_LocalInvocationIndex, g = flat_group();
#if defined(MOE_SORT_COUNT) || defined(MOE_SORT_SCATTER)
  if (g >= p.chunks) return;
  const uint first = g * p.chunk, end = min(first + p.chunk, p.pairs), row = p.counts + g * p.n_expert;
#endif
#if defined(MOE_SORT_COUNT)
  for (uint e = tid; e < p.n_expert; e += 64) counts[e] = 0;
  barrier();
  for (uint i = first + tid; i < end; i += 64) atomicAdd(counts[experts[i]], 1u);
  barrier();
  for (uint e = tid; e < p.n_expert; e += 64) words[row + e] = counts[e];
#elif defined(MOE_SORT_OFFSETS)
  // Each expert's chunks in turn: their starts within the expert, and its total.
  for (uint e = tid; e < p.n_expert; e += 64) {
    uint at = 0;
    for (uint c = 0; c < p.chunks; ++c) {
      const uint n = words[p.counts + c * p.n_expert + e];
      words[p.counts + c * p.n_expert + e] = at;
      at += n;
    }
    counts[e] = at;
  }
  barrier();
  if (tid == 0) {  // the experts' starts in order (kept in counts) and their first tiles: a short serial scan
    uint at = 0, tile_at = 0;
    for (uint e = 0; e < p.n_expert; ++e) {
      const uint n = counts[e];
      counts[e] = at;
      tile_first[e] = tile_at;
      at += n;
      tile_at += (n + p.tile - 1) / p.tile;
    }
    tiles[0] = uvec4(tile_at, 0, 0, 0);
    tile_first[p.n_expert] = tile_at;
  }
  barrier();
  for (uint e = tid; e < p.n_expert; e += 64) {
    const uint start = counts[e], n = (e + 1 < p.n_expert ? counts[e + 1] : p.pairs) - start;
    for (uint t = 0; t < tile_first[e + 1] - tile_first[e]; ++t) {
      tiles[1 + tile_first[e] + t] = uvec4(e, start + t * p.tile, min(p.tile, n - t * p.tile), 0);
    }
    for (uint c = 0; c < p.chunks; ++c) words[p.counts + c * p.n_expert + e] += start;
  }
#else
  for (uint e = tid; e < p.n_expert; e += 64) counts[e] = words[row + e];
  barrier();
  for (uint i = first + tid; i < end; i += 64) order[atomicAdd(counts[experts[i]], 1u)] = i;
#endif
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
