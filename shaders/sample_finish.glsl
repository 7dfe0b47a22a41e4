// A row finished by one workgroup (the last of the row to arrive, in STATS for a row without
// candidates, else in GATHER): the candidates sorted, the thresholds of top-k, top-p and min-p,
// the draw, and the logprobs. Included by sample.comp only.

shared uint sk[CAP];  // candidates: order keys of their logits (0: empty), then by id in the draw
shared uint si[CAP];  // their ids (NO_INDEX: empty), then their order keys in the draw
shared acc run_f[WG];
shared uint found;
shared int walker_s;
shared uint top_ids[MAX_TOP_N];  // the top logprobs' tokens, kept before sk / si are reused
shared float top_v[MAX_TOP_N];

#define RUN (CAP / WG)

bool precedes(uint ka, uint ia, uint kb, uint ib) { return ka > kb || (ka == kb && ia < ib); }

// sk descending, ties by si ascending: a bitonic sort.
// The first `count` slots, the rest being empty: only the power of two that holds them is sorted.
uint sorted_size(uint count) {
  uint size = 2u;
  while (size < count) size <<= 1u;
  return min(size, CAP);
}

void sort_candidates(uint count) {
  barrier();
  const uint size = sorted_size(count);
  for (uint k = 2u; k <= size; k <<= 1u) {
    for (uint j = k >> 1u; j > 0u; j >>= 1u) {
      for (uint i = tid(); i < size; i += WG) {
        const uint x = i ^ j;
        if (x <= i) continue;
        const bool up = (i & k) == 0u;
        if (up ? precedes(sk[x], si[x], sk[i], si[i]) : precedes(sk[i], si[i], sk[x], si[x])) {
          uint t = sk[i];
          sk[i] = sk[x];
          sk[x] = t;
          t = si[i];
          si[i] = si[x];
          si[x] = t;
        }
      }
      barrier();
    }
  }
}

// run_f's exclusive prefix in invocation order, in place; the total is returned to every invocation.
acc prefix_runs() {
  acc total;
  const acc before = exclusive_prefix(run_f[tid()], total);
  run_f[tid()] = before;
  barrier();
  return total;
}

// ---- passes over the whole row, for what reaches past the candidates ---------------------------
acc row_sum(SampleRow r, uint row, uint key_floor, float m, bool count) {
  acc s = 0.0;
  for (uint i = tid(); i < r.n; i += WG) {
    const float l = logits[row * p.stride + i];
    if (l > NEG_INF && order_key(l) >= key_floor) s += count ? acc(1.0) : acc(weight(l, m, r.inv_t));
  }
  return workgroup_acc_sum(s);
}

// The largest key whose tokens at or above it count at least `target` (tokens, or weight), searched
// between lo (which must reach it) and hi.
uint bisect_keys(SampleRow r, uint row, uint lo, uint hi, acc target, float m, bool count) {
  while (lo < hi) {
    const uint mid = lo + (hi - lo + 1u) / 2u;
    if (row_sum(r, row, mid, m, count) >= target) {
      lo = mid;
    } else {
      hi = mid - 1u;
    }
  }
  return lo;
}

// The tokens at or above key_floor, in id order (up to CAP), into sk / si, sorted as candidates.
uint compact_row(SampleRow r, uint row, uint key_floor) {
  const uint run = (r.n + WG - 1u) / WG, first = tid() * run;
  uint own = 0u;
  for (uint i = first; i < min(first + run, r.n); ++i) {
    const float l = logits[row * p.stride + i];
    if (l > NEG_INF && order_key(l) >= key_floor) ++own;
  }
  run_f[tid()] = acc(own);
  const uint total = uint(prefix_runs());
  uint slot = uint(run_f[tid()]);
  for (uint i = first; i < min(first + run, r.n) && slot < CAP; ++i) {
    const float l = logits[row * p.stride + i];
    if (l > NEG_INF && order_key(l) >= key_floor) {
      sk[slot] = order_key(l);
      si[slot] = i;
      ++slot;
    }
  }
  for (uint s = total + tid(); s < CAP; s += WG) {
    sk[s] = 0u;
    si[s] = NO_INDEX;
  }
  sort_candidates(total);
  return min(total, CAP);
}

// Gathered candidates (values at v, ids at i) into sk / si, sorted.
void load_candidates(uint v, uint i, uint count) {
  for (uint s = tid(); s < CAP; s += WG) {
    const bool live = s < count;
    sk[s] = live ? order_key(uintBitsToFloat(scratch[v + s])) : 0u;
    si[s] = live ? scratch[i + s] : NO_INDEX;
  }
  sort_candidates(count);
}

// ---- thresholds -----------------------------------------------------------------------------------
// The weight of the sorted candidates at or above key_floor.
acc candidate_mass(SampleRow r, uint key_floor, float m) {
  acc s = 0.0;
  for (uint j = 0u; j < RUN; ++j) {
    const uint k = sk[tid() * RUN + j];
    if (k != 0u && k >= key_floor) s += acc(weight(key_float(k), m, r.inv_t));
  }
  return workgroup_acc_sum(s);
}

// The key of the first sorted candidate at or above key_floor where the running weight, from
// `start` (the weight of the tokens above the candidates), reaches target; 0 where the candidates
// do not reach it.
uint nucleus_key(SampleRow r, uint key_floor, acc target, float m, acc start) {
  acc own = 0.0;
  for (uint j = 0u; j < RUN; ++j) {
    const uint k = sk[tid() * RUN + j];
    if (k != 0u && k >= key_floor) own += acc(weight(key_float(k), m, r.inv_t));
  }
  run_f[tid()] = own;
  if (tid() == 0u) walker_s = int(CAP);
  prefix_runs();
  acc running = start + run_f[tid()];
  for (uint j = 0u; j < RUN; ++j) {
    const uint k = sk[tid() * RUN + j];
    if (k == 0u || k < key_floor) continue;
    running += acc(weight(key_float(k), m, r.inv_t));
    if (running >= target) {
      atomicMin(walker_s, int(tid() * RUN + j));
      break;
    }
  }
  barrier();
  const int at = walker_s;
  barrier();
  return at < int(CAP) ? sk[at] : 0u;
}

// ---- the draw -------------------------------------------------------------------------------------
// A kept candidate, in id order (sort_kept_by_id): its id and logit.
void element(uint index, out uint id, out float l) {
  id = ~sk[index];
  l = si[index] == 0u ? NEG_INF : key_float(si[index]);
}

// Walks the kept candidates (l >= t) in id order to where u times their weight lands: runs of
// RUN an invocation, the last run that starts at or before the target walks.
uint draw(SampleRow r, float t, float m) {
  const uint first = tid() * RUN;
  acc own = 0.0;
  for (uint j = first; j < first + RUN; ++j) {
    uint id;
    float l;
    element(j, id, l);
    if (l >= t) own += acc(weight(l, m, r.inv_t));
  }
  run_f[tid()] = own;
  if (tid() == 0u) walker_s = -1;
  const acc target = acc(philox_uniform(r.seed_lo, r.seed_hi, r.counter)) * prefix_runs();
  const acc before = run_f[tid()];
  if (own > 0.0 && before <= target) atomicMax(walker_s, int(tid()));
  barrier();
  if (int(tid()) == walker_s) {
    acc running = before;
    uint pick = NO_INDEX;
    for (uint j = first; j < first + RUN; ++j) {
      uint id;
      float l;
      element(j, id, l);
      if (!(l >= t)) continue;
      const float w = weight(l, m, r.inv_t);
      if (w <= 0.0) continue;
      pick = id;
      running += acc(w);
      if (running > target) break;
    }
    found = pick;
  }
  barrier();
  return found;
}

// The kept candidates (key >= t's, among the first count) re-sorted by id for the draw: sk holds
// ~id, si the order key.
void sort_kept_by_id(uint t_key, uint count) {
  for (uint s = tid(); s < CAP; s += WG) {
    const bool kept = sk[s] != 0u && sk[s] >= t_key;
    const uint k = sk[s];
    sk[s] = kept ? ~si[s] : 0u;
    si[s] = kept ? k : 0u;
  }
  sort_candidates(count);
}

// ---- the row --------------------------------------------------------------------------------------
// A nucleus whose window SELECT found past the top candidates, with nothing else asking for them
// (no top-k, no top logprobs): they are neither loaded nor sorted.
bool past_top(SampleRow r, uint sel) {
  return !wants_top_k(r) && top_n(r) == 0u && int(scratch[sel + SEL_WINDOW]) > int(scratch[sel + SEL_BIN]);
}

struct Thresholds {
  float top_k;
  bool top_k_in_candidates;
  float top_p;
  bool window_loaded;  // sk / si hold the nucleus window, not the top candidates
};

// Top-p's threshold: in the top candidates, else in the window of bins SELECT found near it (from
// the weight of the tokens above the window), else by bisection over the whole row.
float top_p_threshold(SampleRow r, uint row, uint base, uint sel, uint floor_key, acc target, float m,
                      bool overflow, inout bool window_loaded) {
  uint key = overflow || past_top(r, sel) ? 0u : nucleus_key(r, floor_key, target, m, acc(0.0));
  if (key == 0u && int(scratch[sel + SEL_WINDOW]) >= 0 && scratch[sel + SEL_WINDOW_COUNT] <= CAP) {
    const acc above = load_chunk_masses(masses_at(base, p.groups), chunks_of(r.n));
    load_candidates(window_v_at(base, p.groups), window_i_at(base, p.groups), scratch[sel + SEL_WINDOW_COUNT]);
    window_loaded = true;
    key = nucleus_key(r, floor_key, target, m, above);
  }
  return key_float(key != 0u ? key : bisect_keys(r, row, floor_key, order_key(m), target, m, false));
}

Thresholds thresholds(SampleRow r, uint row, uint base, uint sel, uint count, bool overflow, float m, acc zt) {
  Thresholds t = Thresholds(NEG_INF, true, NEG_INF, false);
  if (wants_top_k(r)) {
    t.top_k_in_candidates = !overflow && r.top_k <= count;
    t.top_k = key_float(t.top_k_in_candidates ? sk[r.top_k - 1u]
                                              : bisect_keys(r, row, order_key(NEG_INF), order_key(m), acc(r.top_k), m, true));
  }
  if (!wants_top_p(r)) return t;
  const uint floor_key = order_key(t.top_k);
  const acc zk = !wants_top_k(r) ? zt : t.top_k_in_candidates ? candidate_mass(r, floor_key, m)
                                                              : row_sum(r, row, floor_key, m, false);
  const acc target = acc(r.top_p) * zk * (acc(1.0) - TOP_P_TOLERANCE);
  t.top_p = top_p_threshold(r, row, base, sel, floor_key, target, m, overflow, t.window_loaded);
  return t;
}

// The top logprobs (sk / si sorted, count of them) kept aside.
void keep_top_logprobs(SampleRow r, uint count) {
  barrier();
  if (tid() == 0u) {
    for (uint s = 0u; s < MAX_TOP_N; ++s) {
      const bool live = s < min(top_n(r), count);
      top_ids[s] = live ? si[s] : NO_INDEX;
      top_v[s] = live ? key_float(sk[s]) : NEG_INF;
    }
  }
  barrier();
}

// The token (NO_INDEX: the whole-row passes draw it and write it), its logprob, the top logprobs.
void write_out(SampleRow r, uint row, uint token, float lse) {
  if (tid() != 0u) return;
  const uint at = row * OUT_WORDS;
  if (token != NO_INDEX) write_token(r, row, token, lse);
  if ((r.flags & FLAG_LOGPROBS) == 0u) return;
  for (uint s = 0u; s < MAX_TOP_N; ++s) {
    out_words[at + 2u + 2u * s] = top_ids[s];
    out_words[at + 3u + 2u * s] = floatBitsToUint(top_ids[s] == NO_INDEX ? NEG_INF : top_v[s] - lse);
  }
}

// The draw left to the whole-row passes: the kept tokens are l >= t.
void defer_draw(uint sel, float t) {
  if (tid() != 0u) return;
  scratch[sel + SEL_THRESHOLD] = floatBitsToUint(t);
  scratch[sel + SEL_DRAW] = 1u;
}

void finish_row(uint row, SampleRow r) {
  const uint base = row_base(row), sel = sel_at(base, p.groups);
  const uint argmax = scratch[sel + SEL_ARGMAX];
  if (argmax == NO_INDEX) {  // nothing finite in the row: the host fails the request
    if (tid() == 0u) {
      ids[row] = 0u;
      out_words[row * OUT_WORDS] = NO_INDEX;
    }
    return;
  }
  const float m = uintBitsToFloat(scratch[sel + SEL_MAX]), lse = uintBitsToFloat(scratch[sel + SEL_LSE]);
  const acc zt = load_acc(sel + SEL_ZT);
  const int last_bin = int(scratch[sel + SEL_BIN]);
  uint count = 0u;
  bool overflow = false;
  if (needs_candidates(r) && !past_top(r, sel)) {
    count = scratch[sel + SEL_COUNT];
    overflow = count > CAP;
    if (!overflow) {
      load_candidates(cand_v_at(base, p.groups), cand_i_at(base, p.groups), count);
    } else {
      // Too many gathered to sort: the top logprobs' own candidates, found over the whole row.
      const uint n = max(top_n(r), 1u);
      count = compact_row(r, row, bisect_keys(r, row, order_key(NEG_INF), order_key(m), acc(n), m, true));
    }
  }
  keep_top_logprobs(r, count);
  uint token = argmax;
  if (r.temperature > 0.0 && draws_whole_row(r)) {
    const float t = min_p_threshold(r, m);
    if (t == NEG_INF) {
      token = draw_from_stats(r, row, base, m);
    } else {
      defer_draw(sel, t);
      token = NO_INDEX;
    }
  } else if (r.temperature > 0.0) {
    const Thresholds t = thresholds(r, row, base, sel, count, overflow, m, zt);
    const float kept = max(t.top_k, max(t.top_p, min_p_threshold(r, m)));
    if (!overflow && !past_top(r, sel) && last_bin >= 0 &&
        bin_of(kept, m, uintBitsToFloat(scratch[sel + SEL_SCALE])) <= uint(last_bin)) {
      if (t.window_loaded) load_candidates(cand_v_at(base, p.groups), cand_i_at(base, p.groups), count);
      barrier();
      sort_kept_by_id(order_key(kept), count);
      token = draw(r, kept, m);
    } else {
      defer_draw(sel, kept);
      token = NO_INDEX;
    }
  }
  write_out(r, row, token, lse);
}
