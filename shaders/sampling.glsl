// What the sampling passes (sample.comp) share: each output row's parameters, the scratch layout,
// the order-preserving keys of floats and the counter-based random numbers.
//
// The semantics are the CPU sampler's (model/sampling/sampler.hpp): every filter is a threshold
// on the adjusted logits, ties at a threshold kept, and the draw walks the kept tokens by id.

// One output row's sampling, as the host packs it (gpu/ops.hpp: SampleRow; std430).
struct SampleRow {
  float temperature;   // 0: argmax
  float inv_t;         // 1 / temperature (1 when greedy), as the CPU computes it in float
  float top_p;         // 1: off
  float min_p_offset;  // temperature * log(min_p), -inf when off
  float repetition;    // 1: off; negative logits are multiplied by it
  float inv_repetition;  // 1 / repetition in float (the host's): positive logits are multiplied by it
  float presence;
  float frequency;
  uint top_k;          // 0: off
  uint seed_lo, seed_hi;
  uint counter;        // the draw's index: tokens the sequence generated before it
  uint n;              // columns that may be sampled (<= the row stride)
  uint entries_offset, entries_count;  // into entries: (token, bias bits, in window, count)
  uint mask_offset;    // into mask: n bits, bit set = allowed; NO_MASK: all allowed
  uint flags;          // FLAG_* below, and the pending token's row in prev_ids at bit 16
};
#define NO_MASK 0xFFFFFFFFu
#define FLAG_TOP_N 0xFFu          // how many top logprobs (<= MAX_TOP_N)
#define FLAG_LOGPROBS 0x100u      // the chosen token's logprob
#define FLAG_PENDING 0x200u       // the token before this draw is prev_ids[flags >> 16], not yet in the entries
#define FLAG_WINDOW 0x400u        // the repetition penalty is on (the pending token enters its window)

#define MAX_TOP_N 20u
#define OUT_WORDS (2u + 2u * MAX_TOP_N)  // token, logprob bits, then (id, logprob bits) pairs

// Sums of weights: double where the device has it (F64_SUMS), as the CPU sampler sums them.
#if defined(F64_SUMS)
#define acc double
#define TOP_P_TOLERANCE 1e-6LF
uvec2 acc_bits(acc v) { return unpackDouble2x32(v); }
acc acc_of(uvec2 bits) { return packDouble2x32(bits); }
#else
#define acc float
#define TOP_P_TOLERANCE 1e-6
uvec2 acc_bits(acc v) { return uvec2(floatBitsToUint(v), 0u); }
acc acc_of(uvec2 bits) { return uintBitsToFloat(bits.x); }
#endif

// Scratch per row: the chunks' statistics, their kept masses, the histogram of distances from
// the maximum, what the selection pass decided, and the candidates gathered.
#define CHUNK 4096u   // logits per workgroup of the wide passes (16 per invocation)
#define BINS 2048u    // the histogram's bins of (max - l): see bin_scale
#define BIN_STEPS 32.0
#define CAP 2048u     // candidates a row's finishing workgroup sorts
#define TOP_FEW 512u  // the top candidates gathered where no top-k asks for more
#define PART_WORDS 6u // a chunk's max, argmax, sum of exp at T = 1, sum of weights (2 words), min
#define SEL_WORDS 16u
// sel: what the passes decide for a row, for the passes after them.
#define SEL_BIN 0u           // the last bin of the top candidates (-1: even the first holds more than CAP)
#define SEL_UNUSED 1u        // (3 words)
// A row's arrival counters, one a wide pass (gpu/ops.hpp: sample_arrival_words): the workgroups of
// the row that finished the pass; the last resets it.
#define ARRIVAL_WORDS 4u
#define ARRIVE_STATS 0u
#define ARRIVE_BINS 1u
#define ARRIVE_GATHER 2u
#define ARRIVE_DRAW 3u
#define SEL_COUNT 4u         // top candidates gathered (atomic)
#define SEL_MAX 5u           // the row's maximum
#define SEL_LSE 6u           // its log-sum-exp at temperature 1
#define SEL_ZT 7u            // its sum of weights at its temperature (2 words)
#define SEL_ARGMAX 9u        // NO_INDEX: nothing finite
#define SEL_WINDOW 10u       // the nucleus window's first and last bin (-1: none)
#define SEL_WINDOW_COUNT 12u // its tokens gathered (atomic)
#define SEL_DRAW 13u         // 1: FINISH left the draw to the whole-row passes
#define SEL_THRESHOLD 14u    // their threshold: the kept tokens are l >= it
#define SEL_SCALE 15u        // the histogram's bins per unit of logit (bin_scale)

// The chunks a row of n logits spans.
uint chunks_of(uint n) { return (n + CHUNK - 1u) / CHUNK; }

// A bin's weight in fixed point: each token's weight (at most 1) times MASS_ONE, truncated, so a
// workgroup's 4,096 fit a word.
#define MASS_ONE 524288.0

uint row_words(uint groups) { return (PART_WORDS + 2u) * groups + BINS + SEL_WORDS + 4u * CAP + 2u * BINS; }
uint parts_at(uint base) { return base; }                                        // (groups) x PART_WORDS
uint masses_at(uint base, uint groups) { return base + PART_WORDS * groups; }    // (groups) x 2
uint hist_at(uint base, uint groups) { return base + (PART_WORDS + 2u) * groups; }  // (BINS)
uint sel_at(uint base, uint groups) { return hist_at(base, groups) + BINS; }
uint cand_v_at(uint base, uint groups) { return sel_at(base, groups) + SEL_WORDS; }
uint cand_i_at(uint base, uint groups) { return cand_v_at(base, groups) + CAP; }
uint window_v_at(uint base, uint groups) { return cand_i_at(base, groups) + CAP; }
uint window_i_at(uint base, uint groups) { return window_v_at(base, groups) + CAP; }
uint bin_mass_at(uint base, uint groups) { return window_i_at(base, groups) + CAP; }  // (BINS) x 2: low, high word

// What a row asks of the passes.
bool wants_top_k(SampleRow r) { return r.temperature > 0.0 && r.top_k > 0u && r.top_k < r.n; }
bool wants_top_p(SampleRow r) { return r.temperature > 0.0 && r.top_p < 1.0; }
uint top_n(SampleRow r) { return (r.flags & FLAG_LOGPROBS) != 0u ? min(r.flags & FLAG_TOP_N, MAX_TOP_N) : 0u; }
bool needs_candidates(SampleRow r) { return wants_top_k(r) || wants_top_p(r) || top_n(r) > 0u; }
// The draw walks the whole row by id: nothing but min-p narrows it.
bool draws_whole_row(SampleRow r) { return r.temperature > 0.0 && !wants_top_k(r) && !wants_top_p(r); }

// The histogram bin of a logit, relative to the row's maximum. The same float operations in every
// pass, so a logit falls in the same bin in each; monotone in l.
// Bins per unit of logit: steps of at most 1/BIN_STEPS of the temperature (a bin's weights within
// e^(1/32) of each other), finer where the row's finite logits span less than BINS of those: a
// flat row (a nucleus of most of the vocabulary) then still has few tokens a bin near any threshold.
float bin_scale(SampleRow r, float m, float lowest) {
  const float coarsest = float(BIN_STEPS) * r.inv_t, range = m - lowest;
  return range > 0.0 ? max(coarsest, float(BINS - 1u) / range) : coarsest;
}
uint bin_of(float l, float m, float scale) {
  const float d = (m - l) * scale;
  return d < float(BINS) ? uint(d) : BINS;
}

// Unsigned keys in the order of the floats (-inf lowest).
uint order_key(float f) {
  const uint u = floatBitsToUint(f);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
float key_float(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7FFFFFFFu) : ~k); }

// NaN counts as -inf and +inf as the largest float, as the CPU sampler reads logits.
float sanitised(float l) {
  if (isnan(l)) return uintBitsToFloat(0xFF800000u);
  return isinf(l) && l > 0.0 ? uintBitsToFloat(0x7F7FFFFFu) : l;
}
#define NEG_INF uintBitsToFloat(0xFF800000u)

// Philox4x32-10 (Salmon et al., SC 2011): the uniform number of draw `counter` of a seed, exact in
// float and double: the first output word's high 24 bits.
float philox_uniform(uint seed_lo, uint seed_hi, uint counter) {
  uvec4 c = uvec4(counter, 0u, 0u, 0u);
  uvec2 k = uvec2(seed_lo, seed_hi);
  for (int round = 0; round < 10; ++round) {
    uint hi0, lo0, hi1, lo1;
    umulExtended(0xD2511F53u, c.x, hi0, lo0);
    umulExtended(0xCD9E8D57u, c.z, hi1, lo1);
    c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k += uvec2(0x9E3779B9u, 0xBB67AE85u);
  }
  return float(c.x >> 8) * (1.0 / 16777216.0);
}
