#version 450
// Sampling on the GPU, every output row of a step at once, in five passes (gpu/ops.hpp: sample):
//   PREPARE (a workgroup a row): logit_bias and the penalties on the tokens the host lists, and on
//     the token the step before chose (still on the GPU when this step was sent);
//   STATS (CHUNK logits a workgroup): the mask applied, each chunk's maximum, its argmax and its
//     sums of exp at temperature 1 and at the row's temperature;
//   BINS (a workgroup a chunk): where the row needs candidates (top-k, top-p, top logprobs), a
//     histogram of the logits' distances from the maximum; where the draw walks the whole row (no
//     top-k, no top-p), each chunk's mass of the tokens min-p keeps;
//   SELECT (a workgroup a row): the last histogram bin whose tokens fit in CAP candidates, and for
//     a whole-row draw the chunk the random number lands in;
//   GATHER (a workgroup a chunk): the candidates, and the whole-row draw's walk of its chunk;
//   FINISH (a workgroup a row): the candidates sorted, the thresholds, the draw among the kept
//     candidates, the logprobs. Where the kept set or the top logprobs reach past the candidates
//     (a flat distribution: more than CAP tokens within 1/32 of the temperature of each other
//     near the top, or a nucleus of more than CAP tokens), it finds them exactly by passes over
//     the whole row: slower, and as exact.
// The semantics are the CPU sampler's (model/sampling/sampler.hpp); reductions go in a fixed
// order, so a row's token depends on its own logits, parameters and seed only.
#include "common.glsl"
#include "select.glsl"
#include "reduce.glsl"
#include "sampling.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint rows; uint stride; uint groups; uint unused; } p;
layout(binding = 0) coherent buffer Logits { float logits[]; };
layout(binding = 1) readonly buffer Rows { SampleRow rows_[]; };
layout(binding = 2) readonly buffer Entries { uvec4 entries[]; };
layout(binding = 3) readonly buffer Mask { uint mask[]; };
layout(binding = 4) readonly buffer PrevIds { uint prev_ids[]; };
layout(binding = 5) coherent buffer Scratch { uint scratch[]; };
layout(binding = 6) buffer Out { uint out_words[]; };
layout(binding = 7) writeonly buffer Ids { uint ids[]; };

#define WG 256u
#define PER_THREAD (CHUNK / WG)

uint tid() { return gl_LocalInvocationIndex; }

// A workgroup's sum of weights, in a fixed order (a tree over the invocations).
shared acc acc_tree[WG];
acc workgroup_acc_sum(acc v) {
  barrier();
  acc_tree[tid()] = v;
  barrier();
  for (uint s = WG / 2u; s > 0u; s /= 2u) {
    if (tid() < s) acc_tree[tid()] += acc_tree[tid() + s];
    barrier();
  }
  const acc total = acc_tree[0];
  barrier();
  return total;
}
uint row_base(uint row) { return row * row_words(p.groups); }
float weight(float l, float m, float inv_t) { return exp((l - m) * inv_t); }

#if defined(SAMPLE_PREPARE)
// ---- bias and penalties, in place ----------------------------------------------------------------
shared bool pending_listed;

void adjust(SampleRow r, uint row, uint token, float bias, bool in_window, uint count) {
  if (token >= r.n) return;
  const uint i = row * p.stride + token;
  precise float l = sanitised(logits[i]) + bias;
  if (in_window) l = l > 0.0 ? l * r.inv_repetition : l * r.repetition;
  if (count > 0u) l -= float(count) * r.frequency + r.presence;
  logits[i] = l;
}

void main() {
  const uint row = flat_group();
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint sel = sel_at(row_base(row), p.groups);
  for (uint b = tid(); b < BINS; b += WG) scratch[hist_at(row_base(row), p.groups) + b] = 0u;
  if (tid() == 0u) {
    scratch[sel + SEL_COUNT] = 0u;
    pending_listed = false;
  }
  barrier();
  const bool pending = (r.flags & FLAG_PENDING) != 0u;
  const bool window = (r.flags & FLAG_WINDOW) != 0u;
  const uint pend = pending ? prev_ids[r.flags >> 16] : NO_INDEX;
  for (uint e = tid(); e < r.entries_count; e += WG) {
    const uvec4 en = entries[r.entries_offset + e];
    const bool is_pending = en.x == pend;
    if (is_pending) pending_listed = true;
    adjust(r, row, en.x, uintBitsToFloat(en.y), en.z != 0u || (is_pending && window), en.w + (is_pending ? 1u : 0u));
  }
  barrier();
  if (tid() == 0u && pending && !pending_listed) adjust(r, row, pend, 0.0, window, 1u);
}

#elif defined(SAMPLE_STATS)
// ---- each chunk's maximum, argmax and sums of exp ----------------------------------------------
shared float best_v[WG];
shared uint best_i[WG];

void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint first = g * CHUNK;
  float v[PER_THREAD];
  float bv = 0.0;
  uint bi = NO_INDEX;
  for (uint j = 0u; j < PER_THREAD; ++j) {
    const uint i = first + j * WG + tid();
    v[j] = NEG_INF;
    if (i >= r.n) continue;
    const float raw = logits[row * p.stride + i];
    float l = sanitised(raw);
    if (r.mask_offset != NO_MASK && (mask[r.mask_offset + i / 32u] & (1u << (i % 32u))) == 0u) l = NEG_INF;
    if (!(l == raw)) logits[row * p.stride + i] = l;
    v[j] = l;
    if (better(l, i, bv, bi)) { bv = l; bi = i; }
  }
  best_v[tid()] = bv;
  best_i[tid()] = bi;
  barrier();
  for (uint s = WG / 2u; s > 0u; s /= 2u) {
    if (tid() < s && better(best_v[tid() + s], best_i[tid() + s], best_v[tid()], best_i[tid()])) {
      best_v[tid()] = best_v[tid() + s];
      best_i[tid()] = best_i[tid() + s];
    }
    barrier();
  }
  const uint best = best_i[0];
  const float m = best == NO_INDEX ? NEG_INF : best_v[0];
  float s1 = 0.0;
  acc st = 0.0;
  if (best != NO_INDEX) {
    for (uint j = 0u; j < PER_THREAD; ++j) {
      s1 += exp(v[j] - m);
      if (r.temperature > 0.0) st += acc(weight(v[j], m, r.inv_t));
    }
  }
  s1 = workgroup_sum(s1);
  st = workgroup_acc_sum(st);
  if (tid() == 0u) {
    const uint at = parts_at(row_base(row)) + PART_WORDS * g;
    const uvec2 bits = acc_bits(st);
    scratch[at] = floatBitsToUint(m);
    scratch[at + 1u] = best;
    scratch[at + 2u] = floatBitsToUint(s1);
    scratch[at + 3u] = bits.x;
    scratch[at + 4u] = bits.y;
  }
}

#else
// ---- the passes that know the row's maximum ---------------------------------------------------
float row_max(uint base) {
  const float pm = tid() < p.groups ? uintBitsToFloat(scratch[parts_at(base) + PART_WORDS * tid()]) : NEG_INF;
  return workgroup_max(pm);
}

// The weight of the tokens min-p keeps (all, when it is off).
float min_p_threshold(SampleRow r, float m) { return r.min_p_offset > NEG_INF ? m + r.min_p_offset : NEG_INF; }

// This invocation's contiguous run of a chunk: the whole-row draw walks runs in id order.
acc run_mass(SampleRow r, uint row, uint g, float m, float t) {
  acc mass = 0.0;
  for (uint j = 0u; j < PER_THREAD; ++j) {
    const uint i = g * CHUNK + tid() * PER_THREAD + j;
    if (i >= r.n) break;
    const float l = logits[row * p.stride + i];
    if (l >= t) mass += acc(weight(l, m, r.inv_t));
  }
  return mass;
}

#if defined(SAMPLE_BINS)
shared uint shist[BINS];

void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint base = row_base(row);
  const float m = row_max(base);
  if (g * CHUNK >= r.n || m == NEG_INF) return;
  if (needs_candidates(r)) {
    for (uint b = tid(); b < BINS; b += WG) shist[b] = 0u;
    barrier();
    const float scale = bin_scale(r);
    for (uint j = 0u; j < PER_THREAD; ++j) {
      const uint i = g * CHUNK + j * WG + tid();
      if (i >= r.n) break;
      const float l = logits[row * p.stride + i];
      const uint b = bin_of(l, m, scale);
      if (b < BINS && l > NEG_INF) atomicAdd(shist[b], 1u);
    }
    barrier();
    for (uint b = tid(); b < BINS; b += WG) {
      if (shist[b] != 0u) atomicAdd(scratch[hist_at(base, p.groups) + b], shist[b]);
    }
  }
  if (draws_whole_row(r)) {
    const uvec2 mass = acc_bits(workgroup_acc_sum(run_mass(r, row, g, m, min_p_threshold(r, m))));
    if (tid() == 0u) {
      scratch[masses_at(base, p.groups) + 2u * g] = mass.x;
      scratch[masses_at(base, p.groups) + 2u * g + 1u] = mass.y;
    }
  }
}

#elif defined(SAMPLE_SELECT)
shared uint run_sum[WG];
shared int last_bin;
shared uint min_index[64];

uint workgroup_min(uint v) {
  v = subgroupMin(v);
  barrier();
  if (subgroupElect()) min_index[gl_SubgroupID] = v;
  barrier();
  uint r = min_index[0];
  for (uint s = 1u; s < gl_NumSubgroups; ++s) r = min(r, min_index[s]);
  return r;
}

// The last bin whose tokens, with those of the bins before it, fit in CAP candidates (-1: none).
int last_fitting_bin(uint base) {
  const uint per = BINS / WG, hist = hist_at(base, p.groups);
  uint own = 0u;
  for (uint j = 0u; j < per; ++j) own += scratch[hist + tid() * per + j];
  run_sum[tid()] = own;
  if (tid() == 0u) last_bin = -1;
  barrier();
  if (tid() == 0u) {  // 256 sums, in order: the exclusive prefix of each run
    uint total = 0u;
    for (uint t = 0u; t < WG; ++t) {
      const uint s = run_sum[t];
      run_sum[t] = total;
      total += s;
    }
  }
  barrier();
  uint cum = run_sum[tid()];
  int fits = -1;
  for (uint j = 0u; j < per; ++j) {
    cum += scratch[hist + tid() * per + j];
    if (cum <= CAP) fits = int(tid() * per + j);
  }
  atomicMax(last_bin, fits);
  barrier();
  return last_bin;
}

void main() {
  const uint row = flat_group();
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  const bool part = tid() < p.groups;
  const uint at = parts_at(base) + PART_WORDS * tid();
  const float pm = part ? uintBitsToFloat(scratch[at]) : NEG_INF;
  const float m = workgroup_max(pm);
  const uint argmax = workgroup_min(part && pm == m ? scratch[at + 1u] : NO_INDEX);
  const bool live = part && pm > NEG_INF;
  const float s1 = workgroup_sum(live ? uintBitsToFloat(scratch[at + 2u]) * exp(pm - m) : 0.0);
  const acc zt = workgroup_acc_sum(live && r.temperature > 0.0
                                       ? acc_of(uvec2(scratch[at + 3u], scratch[at + 4u])) * acc(weight(pm, m, r.inv_t))
                                       : acc(0.0));
  const int bin = needs_candidates(r) ? last_fitting_bin(base) : -1;
  if (tid() != 0u) return;
  scratch[sel + SEL_MAX] = floatBitsToUint(m);
  scratch[sel + SEL_LSE] = floatBitsToUint(m + log(s1));
  scratch[sel + SEL_ZT] = acc_bits(zt).x;
  scratch[sel + SEL_ZT + 1u] = acc_bits(zt).y;
  scratch[sel + SEL_ARGMAX] = argmax;
  scratch[sel + SEL_BIN] = uint(bin);
  if (!draws_whole_row(r) || argmax == NO_INDEX) return;
  // The chunk the draw lands in, and how far into its mass.
  acc total = 0.0;
  const uint chunks = chunks_of(r.n), masses = masses_at(base, p.groups);
  for (uint g = 0u; g < chunks; ++g) total += acc_of(uvec2(scratch[masses + 2u * g], scratch[masses + 2u * g + 1u]));
  const acc target = acc(philox_uniform(r.seed_lo, r.seed_hi, r.counter)) * total;
  acc before = 0.0, chunk_before = 0.0;
  uint chunk = 0u;
  for (uint g = 0u; g < chunks; ++g) {
    const acc mass = acc_of(uvec2(scratch[masses + 2u * g], scratch[masses + 2u * g + 1u]));
    if (mass <= 0.0) continue;
    chunk = g;
    chunk_before = before;
    if (before + mass > target) break;
    before += mass;
  }
  scratch[sel + SEL_CHUNK] = chunk;
  const uvec2 residual = acc_bits(max(target - chunk_before, acc(0.0)));
  scratch[sel + SEL_RESIDUAL] = residual.x;
  scratch[sel + SEL_RESIDUAL + 1u] = residual.y;
}

#elif defined(SAMPLE_GATHER)
shared acc run_prefix[WG];
shared uint chosen;
shared int walker;

// The whole-row draw, in the chunk it landed in: the last run that starts at or before the
// residual walks to it (or to its last token, where rounding left the residual past its end).
uint walk_chunk(SampleRow r, uint row, uint g, float m, acc residual) {
  const float t = min_p_threshold(r, m);
  const acc own = run_mass(r, row, g, m, t);
  run_prefix[tid()] = own;
  if (tid() == 0u) {
    chosen = NO_INDEX;
    walker = -1;
  }
  barrier();
  if (tid() == 0u) {
    acc total = 0.0;
    for (uint s = 0u; s < WG; ++s) {
      const acc mass = run_prefix[s];
      run_prefix[s] = total;
      total += mass;
    }
  }
  barrier();
  const acc before = run_prefix[tid()];
  if (own > 0.0 && before <= residual) atomicMax(walker, int(tid()));
  barrier();
  if (int(tid()) == walker) {
    acc running = before;
    uint pick = NO_INDEX;
    for (uint j = 0u; j < PER_THREAD; ++j) {
      const uint i = g * CHUNK + tid() * PER_THREAD + j;
      if (i >= r.n) break;
      const float l = logits[row * p.stride + i];
      if (!(l >= t)) continue;
      const float w = weight(l, m, r.inv_t);
      if (w <= 0.0) continue;
      pick = i;
      running += acc(w);
      if (running > residual) break;
    }
    chosen = pick;
  }
  barrier();
  return chosen;
}

void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  if (g * CHUNK >= r.n || scratch[sel + SEL_ARGMAX] == NO_INDEX) return;
  const float m = uintBitsToFloat(scratch[sel + SEL_MAX]);
  if (needs_candidates(r)) {
    const uint last = uint(max(int(scratch[sel + SEL_BIN]), 0));
    const float scale = bin_scale(r);
    for (uint j = 0u; j < PER_THREAD; ++j) {
      const uint i = g * CHUNK + j * WG + tid();
      if (i >= r.n) break;
      const float l = logits[row * p.stride + i];
      if (l == NEG_INF || bin_of(l, m, scale) > last) continue;
      const uint slot = atomicAdd(scratch[sel + SEL_COUNT], 1u);
      if (slot < CAP) {
        scratch[cand_v_at(base, p.groups) + slot] = floatBitsToUint(l);
        scratch[cand_i_at(base, p.groups) + slot] = i;
      }
    }
  }
  if (draws_whole_row(r) && g == scratch[sel + SEL_CHUNK]) {
    const acc residual = acc_of(uvec2(scratch[sel + SEL_RESIDUAL], scratch[sel + SEL_RESIDUAL + 1u]));
    const uint token = walk_chunk(r, row, g, m, residual);
    if (tid() == 0u) out_words[row * OUT_WORDS] = token;
  }
}

#elif defined(SAMPLE_FINISH)
#include "sample_finish.glsl"
#endif
#endif
