#version 450
// Sampling on the GPU, every output row of a step at once (gpu/ops.hpp: sample), in passes that
// read a row in many workgroups (CHUNK logits each); the last workgroup of a row to finish a pass
// (an arrival counter a row) then takes the row's decisions alone, so no pass of one workgroup a
// row costs a dispatch of its own:
//   PREPARE (a row): logit_bias and the penalties on the tokens the host lists, and on the token
//     the step before chose (still on the GPU when this step was sent);
//   STATS (chunks): the mask applied; each chunk's maximum, argmax and sums of exp (and the
//     row's counters for BINS and GATHER cleared). The last: the row's maximum, argmax, log-sum-exp
//     and weight; a row that needs no candidates is finished there (greedy; a whole-row draw
//     without min-p lands by the chunks' weights and walks its chunk);
//   BINS (chunks): where the row needs candidates (top-k, top-p, top logprobs), a histogram of the
//     logits' distances from the maximum, in steps of 1/32 of the temperature. The last: the last
//     bin whose tokens, with those above, fit in CAP candidates; and where a top-p nucleus may
//     reach past them, a window of bins its threshold must lie in, bounded from the bins' counts
//     (a bin's tokens weigh within a factor e^(1/32) of each other);
//   GATHER (chunks): the candidates, the window's tokens, the weight above the window. The last
//     (sample_finish.glsl): the candidates sorted, the top logprobs, the thresholds of top-k,
//     top-p and min-p, and the draw where the kept tokens are all candidates; otherwise the
//     threshold for
//   DRAW (chunks): the draw over the whole row by id: each chunk's kept weight; the last finds the
//     chunk u lands in and walks it to the token.
// What reaches past all of these (more than CAP tokens within 1/32 of the temperature of each
// other at a threshold, a top-k past CAP) is found exactly by bisection over the row when
// finishing: slower, and as exact. The semantics are the CPU sampler's
// (model/sampling/sampler.hpp); sums go in a fixed order, so a row's token depends on its own
// logits, parameters and seed only.
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
layout(binding = 8) coherent buffer Arrivals { uint arrivals[]; };  // (rows) x ARRIVAL_WORDS, zero between passes

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

// This invocation's logits of chunk g, coalesced (the j-th at g * CHUNK + j * WG + tid()), -inf
// past the row's n. Every read is issued before any is used: a loop that read, then wrote or
// added atomically, waited for each read in turn (H100: a pass over 64 rows took 141 us).
void load_chunk(SampleRow r, uint row, uint g, out float l[PER_THREAD]) {
  for (uint j = 0u; j < PER_THREAD; ++j) {
    const uint i = g * CHUNK + j * WG + tid();
    l[j] = i < r.n ? logits[row * p.stride + i] : NEG_INF;
  }
}
float workgroup_min_float(float v) { return -workgroup_max(-v); }

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
  if (tid() == 0u) pending_listed = false;
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

#else
// ---- what the wide passes share ---------------------------------------------------------------
// Whether this workgroup is the last of its row to finish `pass`. Each makes its writes visible
// before it arrives; the last then sees every other's, and resets the counter for the next step.
shared bool arrived_last;
bool last_to_arrive(uint row, uint pass) {
  memoryBarrierBuffer();
  barrier();
  if (tid() == 0u) {
    const uint at = row * ARRIVAL_WORDS + pass;
    arrived_last = atomicAdd(arrivals[at], 1u) == p.groups - 1u;
    if (arrived_last) arrivals[at] = 0u;
  }
  barrier();
  memoryBarrierBuffer();
  return arrived_last;
}

// What one invocation wrote to scratch, visible to the whole workgroup.
void share_scratch() {
  memoryBarrierBuffer();
  barrier();
}

// The row's smallest finite logit (+inf where none).
float row_lowest(uint base) {
  const float inf = uintBitsToFloat(0x7F800000u);
  const float pl = tid() < p.groups ? uintBitsToFloat(scratch[parts_at(base) + PART_WORDS * tid() + 5u]) : inf;
  return workgroup_min_float(pl);
}

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

acc load_acc(uint at) { return acc_of(uvec2(scratch[at], scratch[at + 1u])); }
void store_acc(uint at, acc v) {
  const uvec2 bits = acc_bits(v);
  scratch[at] = bits.x;
  scratch[at + 1u] = bits.y;
}

// Every invocation's exclusive prefix of v in invocation order (the sums of a fixed tree), and
// the total.
shared acc scan_buffer[WG];
acc exclusive_prefix(acc v, out acc total) {
  barrier();
  scan_buffer[tid()] = v;
  barrier();
  for (uint offset = 1u; offset < WG; offset <<= 1u) {
    const acc add = tid() >= offset ? scan_buffer[tid() - offset] : acc(0.0);
    barrier();
    scan_buffer[tid()] += add;
    barrier();
  }
  total = scan_buffer[WG - 1u];
  const acc exclusive = tid() > 0u ? scan_buffer[tid() - 1u] : acc(0.0);
  barrier();
  return exclusive;
}

// ---- the whole-row draw by id ---------------------------------------------------------------------
// The chunks' weights at `masses` (in id order), read at once into shared memory (one after the
// other, each read would wait for the one before), and their total, summed in id order.
shared acc chunk_mass[WG];
acc load_chunk_masses(uint masses, uint chunks) {
  barrier();
  chunk_mass[tid()] = tid() < chunks ? load_acc(masses + 2u * tid()) : acc(0.0);
  barrier();
  acc total = 0.0;
  for (uint g = 0u; g < chunks; ++g) total += chunk_mass[g];
  return total;
}

// The chunk u lands in, from the chunks' kept weights at `masses`, and how far into its weight.
uint landing_chunk(SampleRow r, uint masses, out acc residual) {
  const uint chunks = chunks_of(r.n);
  const acc total = load_chunk_masses(masses, chunks);
  const acc target = acc(philox_uniform(r.seed_lo, r.seed_hi, r.counter)) * total;
  acc before = 0.0, chunk_before = 0.0;
  uint chunk = 0u;
  for (uint g = 0u; g < chunks; ++g) {
    const acc mass = chunk_mass[g];
    if (mass <= 0.0) continue;
    chunk = g;
    chunk_before = before;
    if (before + mass > target) break;
    before += mass;
  }
  residual = max(target - chunk_before, acc(0.0));
  return chunk;
}

shared uint chosen;
shared int walker;
// The draw in the chunk it landed in: the last run that starts at or before the residual walks to
// it (or to its last token, where rounding left the residual past its end).
uint walk_chunk(SampleRow r, uint row, uint g, float m, float t, acc residual) {
  const acc own = run_mass(r, row, g, m, t);
  if (tid() == 0u) {
    chosen = NO_INDEX;
    walker = -1;
  }
  acc total;
  const acc before = exclusive_prefix(own, total);
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

// The whole-row draw over the kept tokens (l >= t), from the chunks' kept weights at `masses`.
uint draw_landing(SampleRow r, uint row, uint masses, float m, float t) {
  acc residual;
  const uint g = landing_chunk(r, masses, residual);
  return walk_chunk(r, row, g, m, t, residual);
}

// A row's chosen token, for the host and for a next step, with its logprob where asked (one
// invocation writes it).
void write_token(SampleRow r, uint row, uint token, float lse) {
  ids[row] = token;
  out_words[row * OUT_WORDS] = token;
  if ((r.flags & FLAG_LOGPROBS) != 0u) out_words[row * OUT_WORDS + 1u] = floatBitsToUint(logits[row * p.stride + token] - lse);
}

#if defined(SAMPLE_STATS) || defined(SAMPLE_GATHER)
// The whole-row draw where every token is kept (no min-p): the chunks' weights are STATS' sums,
// each relative to its own maximum, scaled to the row's. A chunk whose maximum weighs nothing
// beside the row's weighs nothing: the chunk landed in always has a token to walk to.
uint draw_from_stats(SampleRow r, uint row, uint base, float m) {
  const uint masses = masses_at(base, p.groups);
  if (tid() < p.groups) {
    const uint at = parts_at(base) + PART_WORDS * tid();
    const float pm = uintBitsToFloat(scratch[at]);
    const float scale = pm > NEG_INF ? weight(pm, m, r.inv_t) : 0.0;
    store_acc(masses + 2u * tid(), scale > 0.0 ? load_acc(at + 3u) * acc(scale) : acc(0.0));
  }
  share_scratch();
  return draw_landing(r, row, masses, m, NEG_INF);
}

#include "sample_finish.glsl"
#endif

#if defined(SAMPLE_STATS)
// ---- each chunk's maximum, argmax and sums of exp ----------------------------------------------
shared float best_v[WG];
shared uint best_i[WG];

// The row's maximum, argmax, log-sum-exp and sum of weights from its chunks', into sel.
void summarise_row(uint row, SampleRow r) {
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  const bool part = tid() < p.groups;
  const uint at = parts_at(base) + PART_WORDS * tid();
  const float pm = part ? uintBitsToFloat(scratch[at]) : NEG_INF;
  const float m = workgroup_max(pm), scale = bin_scale(r, m, row_lowest(base));
  // Nothing finite (all NaN, -inf or masked): no argmax, and the host fails the request.
  const uint argmax = workgroup_min(part && pm == m && m > NEG_INF ? scratch[at + 1u] : NO_INDEX);
  const bool live = part && pm > NEG_INF;
  const float s1 = workgroup_sum(live ? uintBitsToFloat(scratch[at + 2u]) * exp(pm - m) : 0.0);
  const acc zt = workgroup_acc_sum(live && r.temperature > 0.0 ? load_acc(at + 3u) * acc(weight(pm, m, r.inv_t)) : acc(0.0));
  if (tid() == 0u) {
    scratch[sel + SEL_MAX] = floatBitsToUint(m);
    scratch[sel + SEL_LSE] = floatBitsToUint(m + log(s1));
    store_acc(sel + SEL_ZT, zt);
    scratch[sel + SEL_ARGMAX] = argmax;
    scratch[sel + SEL_BIN] = NO_INDEX;
    scratch[sel + SEL_WINDOW] = NO_INDEX;
    scratch[sel + SEL_WINDOW + 1u] = NO_INDEX;
    scratch[sel + SEL_DRAW] = 0u;
    scratch[sel + SEL_SCALE] = floatBitsToUint(scale);
  }
  share_scratch();
}

void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  if (g == 0u && needs_candidates(r)) {  // the counters BINS and GATHER add to, cleared first
    const uint base = row_base(row), sel = sel_at(base, p.groups);
    for (uint b = tid(); b < BINS; b += WG) scratch[hist_at(base, p.groups) + b] = 0u;
    for (uint b = tid(); b < 2u * BINS; b += WG) scratch[bin_mass_at(base, p.groups) + b] = 0u;
    if (tid() == 0u) {
      scratch[sel + SEL_COUNT] = 0u;
      scratch[sel + SEL_WINDOW_COUNT] = 0u;
    }
  }
  float v[PER_THREAD];
  load_chunk(r, row, g, v);
  float bv = 0.0, lowest = uintBitsToFloat(0x7F800000u);
  uint bi = NO_INDEX;
  for (uint j = 0u; j < PER_THREAD; ++j) {
    const uint i = g * CHUNK + j * WG + tid();
    if (i >= r.n) continue;
    const float raw = v[j];
    float l = sanitised(raw);
    if (r.mask_offset != NO_MASK && (mask[r.mask_offset + i / 32u] & (1u << (i % 32u))) == 0u) l = NEG_INF;
    if (!(l == raw)) logits[row * p.stride + i] = l;
    v[j] = l;
    if (l > NEG_INF) lowest = min(lowest, l);
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
  lowest = workgroup_min_float(lowest);
  if (tid() == 0u) {
    const uint at = parts_at(row_base(row)) + PART_WORDS * g;
    const uvec2 bits = acc_bits(st);
    scratch[at] = floatBitsToUint(m);
    scratch[at + 1u] = best;
    scratch[at + 2u] = floatBitsToUint(s1);
    scratch[at + 3u] = bits.x;
    scratch[at + 4u] = bits.y;
    scratch[at + 5u] = floatBitsToUint(lowest);
  }
  if (!last_to_arrive(row, ARRIVE_STATS)) return;
  summarise_row(row, r);
  // A row with candidates to find is finished after GATHER, unless nothing in it is finite.
  if (!needs_candidates(r) || scratch[sel_at(row_base(row), p.groups) + SEL_ARGMAX] == NO_INDEX) finish_row(row, r);
}

#elif defined(SAMPLE_BINS)
shared uint shist[BINS];
shared uint smass[BINS];  // the bin's weights in fixed point (MASS_ONE a weight of 1), truncated
shared int last_bin, window_lo, window_hi;

#define PER_RUN (BINS / WG)

// The last bin whose tokens, with those of the bins before it, fit in `fit` candidates (-1: none).
int last_fitting_bin(uint hist, uint fit) {
  uint own = 0u;
  for (uint j = 0u; j < PER_RUN; ++j) own += scratch[hist + tid() * PER_RUN + j];
  if (tid() == 0u) last_bin = -1;
  acc total;
  uint cum = uint(exclusive_prefix(acc(own), total));
  int fits = -1;
  for (uint j = 0u; j < PER_RUN; ++j) {
    cum += scratch[hist + tid() * PER_RUN + j];
    if (cum <= fit) fits = int(tid() * PER_RUN + j);
  }
  atomicMax(last_bin, fits);
  barrier();
  return last_bin;
}

// The bins where the running weight from the top first reaches target, from the bins' masses in
// fixed point (each token's weight truncated: a bin's true weight lies in [F, F + count] / MASS_ONE):
// from the first bin whose upper bound reaches it to the first whose lower bound does. -1 where
// they hold more than CAP tokens (the nucleus is then found over the row).
acc bin_mass(uint at, uint b) { return acc(scratch[at + 2u * b]) + acc(scratch[at + 2u * b + 1u]) * acc(4294967296.0); }

ivec2 nucleus_window(uint hist, uint mass, acc target) {
  const acc unit = acc(1.0) / acc(MASS_ONE);
  acc hi = 0.0, lo = 0.0;
  for (uint j = 0u; j < PER_RUN; ++j) {
    const uint b = tid() * PER_RUN + j;
    lo += bin_mass(mass, b);
    hi += bin_mass(mass, b) + acc(scratch[hist + b]);
  }
  if (tid() == 0u) {
    window_lo = int(BINS);
    window_hi = int(BINS);
  }
  acc total;
  const acc hi_before = exclusive_prefix(hi, total), lo_before = exclusive_prefix(lo, total);
  // The float sums of the exact pass differ from these integers by rounding: a margin of 1e-5.
  const acc upper_target = target * acc(1.0 - 1e-5) / unit, lower_target = target * acc(1.0 + 1e-5) / unit;
  acc ch = hi_before, cl = lo_before;
  for (uint j = 0u; j < PER_RUN; ++j) {
    const uint b = tid() * PER_RUN + j;
    const bool reached_hi = ch >= upper_target, reached_lo = cl >= lower_target;
    cl += bin_mass(mass, b);
    ch += bin_mass(mass, b) + acc(scratch[hist + b]);
    if (!reached_hi && ch >= upper_target) atomicMin(window_lo, int(b));
    if (!reached_lo && cl >= lower_target) atomicMin(window_hi, int(b));
  }
  barrier();
  ivec2 w = ivec2(window_lo, min(window_hi, int(BINS) - 1));
  if (w.x >= int(BINS)) return ivec2(-1);
  float count = 0.0;
  for (uint b = uint(w.x) + tid(); b <= uint(w.y); b += WG) count += float(scratch[hist + b]);
  const bool fits = workgroup_sum(count) <= float(CAP);
  return fits ? w : ivec2(-1);
}

// From the row's histogram: the bins of the top candidates, and a nucleus window, into sel.
void choose_bins(uint row, SampleRow r) {
  const uint base = row_base(row), sel = sel_at(base, p.groups), hist = hist_at(base, p.groups);
  // Top-k takes k candidates and more (up to CAP); a nucleus of more than TOP_FEW goes to the window.
  const int bin = last_fitting_bin(hist, wants_top_k(r) ? clamp(r.top_k, TOP_FEW, CAP) : TOP_FEW);
  // Without top-k, a nucleus past the top candidates is looked for in a window of bins near it.
  const bool window = wants_top_p(r) && !wants_top_k(r);
  const acc target = acc(r.top_p) * load_acc(sel + SEL_ZT) * (acc(1.0) - TOP_P_TOLERANCE);
  const ivec2 w = window ? nucleus_window(hist, bin_mass_at(base, p.groups), target) : ivec2(-1);
  if (tid() != 0u) return;
  scratch[sel + SEL_BIN] = uint(bin);
  scratch[sel + SEL_WINDOW] = uint(w.x);
  scratch[sel + SEL_WINDOW + 1u] = uint(w.y);
}

void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  const float m = uintBitsToFloat(scratch[sel + SEL_MAX]), scale = uintBitsToFloat(scratch[sel + SEL_SCALE]);
  if (m == NEG_INF || !needs_candidates(r)) return;  // the whole row's workgroups alike
  for (uint b = tid(); b < BINS; b += WG) {
    shist[b] = 0u;
    smass[b] = 0u;
  }
  barrier();
  const bool masses = r.temperature > 0.0;
  float v[PER_THREAD];
  load_chunk(r, row, g, v);
  for (uint j = 0u; j < PER_THREAD; ++j) {
    const float l = v[j];
    const uint b = bin_of(l, m, scale);
    if (b >= BINS || l == NEG_INF) continue;
    atomicAdd(shist[b], 1u);
    if (masses) atomicAdd(smass[b], uint(weight(l, m, r.inv_t) * MASS_ONE));
  }
  barrier();
  // Integer sums: the same totals in any order. A bin's 64-bit mass as two words, with the carry.
  const uint hist = hist_at(base, p.groups), mass = bin_mass_at(base, p.groups);
  for (uint b = tid(); b < BINS; b += WG) {
    if (shist[b] != 0u) atomicAdd(scratch[hist + b], shist[b]);
    const uint v = smass[b];
    if (v == 0u) continue;
    const uint old = atomicAdd(scratch[mass + 2u * b], v);
    if (old + v < old) atomicAdd(scratch[mass + 2u * b + 1u], 1u);
  }
  if (last_to_arrive(row, ARRIVE_BINS)) choose_bins(row, r);
}

#elif defined(SAMPLE_GATHER)
// Token i (logit l) into a list of at most CAP: its slot from the list's counter at sel + counter.
void gather(uint sel, uint counter, uint values, uint ids, float l, uint i) {
  const uint slot = atomicAdd(scratch[sel + counter], 1u);
  if (slot < CAP) {
    scratch[values + slot] = floatBitsToUint(l);
    scratch[ids + slot] = i;
  }
}

// The top candidates (bins up to SEL_BIN), the nucleus window's tokens, and each chunk's weight of
// the tokens above the window (in masses); the last workgroup of the row finishes it.
void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  if (scratch[sel + SEL_ARGMAX] == NO_INDEX || !needs_candidates(r)) return;  // finished by STATS
  const float m = uintBitsToFloat(scratch[sel + SEL_MAX]), scale = uintBitsToFloat(scratch[sel + SEL_SCALE]);
  const uint last = uint(max(int(scratch[sel + SEL_BIN]), 0));
  const int window_lo = int(scratch[sel + SEL_WINDOW]), window_hi = int(scratch[sel + SEL_WINDOW + 1u]);
  acc above = 0.0;
  float v[PER_THREAD];
  load_chunk(r, row, g, v);
  for (uint j = 0u; j < PER_THREAD; ++j) {
    const uint i = g * CHUNK + j * WG + tid();
    const float l = v[j];
    if (l == NEG_INF) continue;
    const uint b = bin_of(l, m, scale);
    if (b <= last) gather(sel, SEL_COUNT, cand_v_at(base, p.groups), cand_i_at(base, p.groups), l, i);
    if (window_lo < 0) continue;
    if (int(b) < window_lo) above += acc(weight(l, m, r.inv_t));
    if (int(b) >= window_lo && int(b) <= window_hi) {
      gather(sel, SEL_WINDOW_COUNT, window_v_at(base, p.groups), window_i_at(base, p.groups), l, i);
    }
  }
  if (window_lo >= 0) {
    above = workgroup_acc_sum(above);
    if (tid() == 0u) store_acc(masses_at(base, p.groups) + 2u * g, above);
  }
  if (last_to_arrive(row, ARRIVE_GATHER)) finish_row(row, r);
}

#elif defined(SAMPLE_DRAW)
// The draws FINISH left to the whole row (it set SEL_DRAW and the threshold): each chunk's weight
// of the kept tokens; the last workgroup of the row lands and walks.
void main() {
  const uint row = gl_WorkGroupID.y, g = gl_WorkGroupID.x;
  if (row >= p.rows) return;
  const SampleRow r = rows_[row];
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  if (scratch[sel + SEL_DRAW] == 0u) return;  // the whole row's workgroups alike
  const float m = uintBitsToFloat(scratch[sel + SEL_MAX]), t = uintBitsToFloat(scratch[sel + SEL_THRESHOLD]);
  float v[PER_THREAD];
  load_chunk(r, row, g, v);
  acc own = 0.0;
  for (uint j = 0u; j < PER_THREAD; ++j) {
    if (v[j] >= t) own += acc(weight(v[j], m, r.inv_t));
  }
  const acc mass = workgroup_acc_sum(own);
  if (tid() == 0u) store_acc(masses_at(base, p.groups) + 2u * g, mass);
  if (!last_to_arrive(row, ARRIVE_DRAW)) return;
  const uint token = draw_landing(r, row, masses_at(base, p.groups), m, t);
  if (tid() == 0u) write_token(r, row, token, uintBitsToFloat(scratch[sel + SEL_LSE]));
}
#endif
#endif
