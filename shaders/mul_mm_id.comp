#version 450
// A mixture of experts' product for wide steps (prefill): mul_mat_id.comp's result, each workgroup
// making TM rows of one expert for one tile of the pairs routed to it (moe.comp's MOE_SORT), so
// that an expert's weights are read once per tile of up to TN pairs rather than once per pair.
// A thread makes one row for the tile's pairs: the tile's activations are staged in shared memory
// KC at a time, each weight quad read once and multiplied into every pair's sum.
#include "common.glsl"
#define A_BINDING 0
#include "weights.glsl"
#if defined(A_Q4_K)  // Q4_K a block of 32 at a time too (quant_units.glsl reads it)
#define QW_BINDING A_BINDING
#include "quant_units.glsl"
#endif

#define TM 64
#define TN 16
#define KC 128
layout(local_size_x = TM) in;
layout(push_constant) uniform Params { uint M; uint K; uint slots; uint per_slot; uint tile0; uint cols; } p;
#include "expert_acts.glsl"
layout(binding = 2) readonly buffer Order { uint order[]; };
layout(binding = 3) readonly buffer Tiles { uvec4 tiles[]; };
layout(binding = 4) writeonly buffer Out { float out_data[]; };

shared vec4 staged[TN][KC / 4];
shared uint tile_pairs[TN];

void main() {
  uint t = p.tile0 + gl_WorkGroupID.y;
  if (t >= tiles[0].x) return;
  uvec4 tile = tiles[1 + t];  // expert, first position in order, pairs
  uint tid = gl_LocalInvocationIndex;
  uint row = gl_WorkGroupID.x * TM + tid;
  if (tid < TN) tile_pairs[tid] = tid < tile.z ? order[tile.y + tid] : 0;
  barrier();
  float acc[TN];
  for (uint c = 0; c < TN; ++c) acc[c] = 0.0;
  uint quads = (p.K + 3) / 4;
  uint first = tile.x * p.M;  // the expert's first row
  for (uint q0 = 0; q0 < quads; q0 += KC / 4) {
    for (uint i = tid; i < TN * (KC / 4); i += TM) {
      uint c = i / (KC / 4), q = q0 + i % (KC / 4);
      uint pair = tile_pairs[c];
      uint act_row = p.per_slot != 0 ? pair : pair / p.slots;
      staged[c][i % (KC / 4)] = c < tile.z && q < quads ? load_b4(act_row, q) : vec4(0.0);
    }
    barrier();
    if (row < p.M) {
      uint end = min(KC / 4, quads - q0);
#if defined(QW_BINDING)
      // The types of quant_units.glsl (and Q4_K) a block of 32 (8 quads, K whole blocks) at a time, each
      // decoded once.
      for (uint q = 0; q < end; q += 8) {
        uvec2 w[4];
        vec2 a, b;
        block32(first + row, (q0 + q) / 8, p.K, w, a, b);
        for (uint i = 0; i < 8; ++i) {
          vec4 wq = block_weights4(w, a, b, i);
          for (uint c = 0; c < TN; ++c) acc[c] += dot(wq, staged[c][q + i]);
        }
      }
#else
      for (uint q = 0; q < end; ++q) {
        vec4 a = load_a4(first + row, q0 + q, p.K);
        for (uint c = 0; c < TN; ++c) acc[c] += dot(a, staged[c][q]);
      }
#endif
    }
    barrier();
  }
  if (row >= p.M) return;
  for (uint c = 0; c < tile.z; ++c) out_data[tile_pairs[c] * p.M + row] = acc[c];
}
