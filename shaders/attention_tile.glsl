// Flash-decoding's loop over a range of keys, attention_split.comp's:
// HG query heads that share KV head kvh (their queries scaled, in q_sh) attend over keys
// [begin, end) of one sequence (its block table from word table_row of block_table). Keys go in
// tiles of TK: scores with eight threads per pair of keys (four per key where the head's vec4
// chunks are not a multiple of eight: head dims 16 and 80), each over an eighth (a quarter) of the
// head dimension (vec4 of f16 each), then the tile's softmax with one subgroup per head, then
// values with threads over (head dimension / 4, key). Each thread issues all its loads of a tile
// before it uses them: a decode step's workgroups have one or two tiles, so the latency of
// dependent loads, not bandwidth, is what they wait on.
//
// Head dims: multiples of 16 up to 256. Where D / 4 divides ATT_THREADS (16, 32, 64, 128, 256) the
// value loop's key subsets cover every thread and the tile evenly, and the checks for the other
// dims (80, 96: 120 of 128 threads in 6 and 5 subsets) fold away when the kernel is specialised.
//
// ATT_THREADS (128) threads work; every invocation of the workgroup calls attend() (it holds
// barriers), and those past ATT_THREADS wait at them. It leaves the running max and sum of
// exponentials of head g in m_sh[g], l_sh[g] and its un-normalised output in attend_output(g, c).
// The includer declares before it D, HG and SOFTCAP (head dimension, query heads, the scores' soft
// cap or 0) and the buffers k_cache, v_cache (uvec2: four F16) and block_table.
const uint ATT_THREADS = 128;
const uint C = D / 4;     // vec4 chunks per row
const uint NK = ATT_THREADS / C;  // keys one pass of the value loop covers
const bool EVEN_VALUES = NK * C == ATT_THREADS;  // every thread takes part in the value loop
const uint TK = 32;       // keys per tile
const uint VK = (TK + NK - 1) / NK;  // keys a thread of the value loop takes per tile
const uint P = C % 8 == 0 ? 8 : 4;   // threads that share one key's score
const uint KPT = TK * P / ATT_THREADS;  // keys a thread scores

shared vec4 q_sh[HG * C];         // scaled queries
shared float s_sh[HG * TK];       // the tile's scores, then their exponentials
shared uint slot_sh[TK];
shared float m_sh[HG], l_sh[HG], corr_sh[HG];
shared vec4 o_sh[HG * NK * C];    // per key subset outputs, summed at the end

vec4 unpack4(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }

// q_sh must be written before (attend's first barrier makes it visible).
void attend(uint kvh, uint kv_heads, uint table_row, uint page_size, uint begin, uint end) {
  const uint tid = gl_LocalInvocationIndex, lane = gl_SubgroupInvocationID;
  const bool working = tid < ATT_THREADS;
  const bool valuing = working && (EVEN_VALUES || tid < NK * C);  // a thread of the value loop
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
      slot_sh[tid] = j < end ? block_table[table_row + j / page_size] * page_size + j % page_size : 0;
    }
    barrier();
    if (working) {
      // Scores: P threads per key, each over 1 / P of the head's chunks, and KPT keys a thread, so
      // that each query chunk read from shared memory serves KPT keys; all loads issued before any
      // is used; xor shuffles sum the P parts.
      const uint part_of = tid % P, k0 = (tid / P) * KPT;
      vec4 kv[KPT][C / P];
      [[unroll]] for (uint kk = 0; kk < KPT; ++kk) {
        const bool live = tile + k0 + kk < end;
        const uint row = (slot_sh[k0 + kk] * kv_heads + kvh) * C;
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
          if (SOFTCAP > 0.0) s[kk] = soft_cap(s[kk], SOFTCAP);
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
    if (valuing) {
      for (uint g = 0; g < HG; ++g) o[g] *= corr_sh[g];
      // Values: every load of the tile issued before the sums (keys past the end weigh 0).
      vec4 vs[VK];
      [[unroll]] for (uint i = 0; i < VK; ++i) {
        const uint k = vk + i * NK;
        const bool live = (TK % NK == 0 || k < TK) && tile + k < end;
        vs[i] = live ? unpack4(v_cache[(slot_sh[k] * kv_heads + kvh) * C + vc]) : vec4(0.0);
      }
      [[unroll]] for (uint i = 0; i < VK; ++i) {
        const uint k = vk + i * NK;
        if ((TK % NK == 0 || k < TK) && tile + k < end) for (uint g = 0; g < HG; ++g) o[g] += s_sh[g * TK + k] * vs[i];
      }
    }
    barrier();
  }

  if (valuing) for (uint g = 0; g < HG; ++g) o_sh[(g * NK + vk) * C + vc] = o[g];
  barrier();
}

// Chunk c (four elements) of head g's un-normalised output, after attend().
vec4 attend_output(uint g, uint c) {
  vec4 acc = vec4(0.0);
  for (uint k = 0; k < NK; ++k) acc += o_sh[(g * NK + k) * C + c];
  return acc;
}
