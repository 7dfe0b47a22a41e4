#version 450
// out(NCOLS, M) = activations(NCOLS, K) x weights(M, K)^T for decode, reading whole GGUF blocks.
// Each workgroup computes ROWS consecutive rows for NCOLS columns (both specialization
// constants, so the accumulators stay in registers); its threads stride along K in units:
//   F32: 8 weights (two 16-byte loads)        F16, BF16: 8 weights (one 16-byte load)
//   Q8_0: a quarter block, 8 weights (scale + four 16-bit words)
//   Q4_0: a quarter block, 8 weights (scale + two 16-bit words)
//   Q4_K: 32 weights (the 16-byte header + one 16-byte word of quants)
// The activations of a unit are loaded once and reused by every row; the scale of a block is
// applied once per unit. Partial sums are reduced in each subgroup, then across subgroups.
// The types of quant_units.glsl (QUNIT: Q4_1 .. IQ4_XS, and the int8 forms of Q4_K, and of Q4_0
// and Q8_0 on activations quantized beforehand) take a unit of 32 weights (one block of the
// activations) with X_INT8 and B_Q8 only.
// With X_INT8 (Q8_0 and Q4_0 only) the activations of each 32-element block are quantized to int8
// as they are loaded (scale: the block's largest magnitude / 127, found across the four threads
// that share the block) and each four weights take one integer dot product: a few instructions
// per weight fewer than unpacking them to floats, which is what bounds the float kernel.
// With B_Q8 (and X_INT8) the activations come quantized already (quantize_q8.comp), a quarter of
// the bytes of F32 for each workgroup to read.
// With ROPE_KV (B_Q8, a fixed shape of an even number of rows) the rows are heads of head_dim and
// go where attention reads them, one dispatch instead of the product and rope_kv_write: MODE 0
// (q) turned by the rotary embedding (normal layout: pairs 2i, 2i + 1, which a workgroup's rows
// hold together) into out; MODE 1 (k) turned and MODE 2 (v) as they are, as F16 into the cache
// rows slots[column] of out (M wide).
// The host guarantees: K % 8 == 0 for float types (rows 16-byte aligned), K a multiple of the
// block for quantized ones, buffer offsets 16-byte aligned.
#include "common.glsl"
#if defined(X_INT8)
#include "int8_blocks.glsl"
#include "int8_dot.glsl"
// With BLOCK32_Q4_0_Q8_0 (and B_Q8: the build passes it for Q8_0, and for Q4_0 up to 4 columns) Q4_0
// and Q8_0 take a whole block a thread too: half the load instructions of their quarter blocks.
#define QW_BINDING 0
#define IQ4_SHARED_LEVELS
#include "quant_units.glsl"
#if defined(QUNIT) && !defined(B_Q8)
#error "the types read in units of eight (quant_units.glsl) take activations quantized beforehand (B_Q8)"
#endif
#endif

#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
#if defined(FIXED_NCOLS)
// The shape fixed at compile time: every loop over rows and columns unrolls, the accumulators
// stay in registers (constants 1 and 2 are then ignored).
const uint ROWS = FIXED_ROWS;
const uint NCOLS = FIXED_NCOLS;
#else
layout(constant_id = 1) const uint ROWS = 2;
layout(constant_id = 2) const uint NCOLS = 1;
#endif
layout(constant_id = 3) const uint ACCUMULATE = 0;  // 1: out += the product (a residual add, fused)
#if defined(B_RMSNORM)
layout(push_constant) uniform Params { uint M; uint K; uint ncols; float eps; } p;
#elif defined(ROPE_KV)
layout(push_constant) uniform Params {
  uint M; uint K; uint ncols; uint head_dim; uint n_dims; float mscale; uint mode;
} p;
layout(binding = 2) buffer OutH { float16_t out_h[]; };  // the cache, for k and v
layout(binding = 3) readonly buffer Pos { int positions[]; };
layout(binding = 4) readonly buffer Slots { uint slots[]; };
layout(binding = 5) readonly buffer Freqs { float freqs[]; };  // (n_dims / 2): rope.comp's
#include "rope_turn.glsl"
#else
layout(push_constant) uniform Params { uint M; uint K; uint ncols; } p;
#endif
layout(binding = 2) buffer Out { float out_data[]; };

// Activation quads: elements 4q .. 4q+3 of column c.
#if defined(B_RMSNORM)
// The activations are rmsnorm(x) * norm weight (binding 1 x, binding 3 the weight): each
// workgroup finds the row's scale itself (x is small and in L2), sparing a dispatch and a barrier.
layout(binding = 1) readonly buffer ActsX { vec4 x4[]; };
layout(binding = 3) readonly buffer NormW { vec4 nw4[]; };
shared float inv_rms[NCOLS];
vec4 load_x4(uint c, uint q) { return x4[c * (p.K / 4) + q] * inv_rms[c] * nw4[q]; }
#elif defined(B_SILU)
// The activations are silu(gate) * up (binding 1 gate, binding 3 up), made as they are loaded.
layout(binding = 1) readonly buffer Gate { vec4 gate4[]; };
layout(binding = 3) readonly buffer Up { vec4 up4[]; };
vec4 load_x4(uint c, uint q) {
  vec4 g = gate4[c * (p.K / 4) + q];
  return g / (1.0 + exp(-g)) * up4[c * (p.K / 4) + q];
}
#elif defined(B_Q8)
// Activations quantized by quantize_q8.comp (X_INT8 only): the bytes of every column as words,
// then one float scale per block of 32 from word ncols * K / 4.
layout(binding = 1) readonly buffer ActsQ8 { uint xw[]; };
layout(binding = 1) readonly buffer ActsQ8Pairs { uvec2 xw2[]; };
layout(binding = 1) readonly buffer ActsQ8Quads { uvec4 xw4[]; };
layout(binding = 1) readonly buffer ActsQ8Scales { float x_scale[]; };
#elif defined(B_F16)
layout(binding = 1) readonly buffer ActsF16 { uvec2 b_h4[]; };
vec4 load_x4(uint c, uint q) {
  uvec2 h = b_h4[c * (p.K / 4) + q];
  return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y));
}
#else
layout(binding = 1) readonly buffer ActsF32 { vec4 b_f4[]; };
vec4 load_x4(uint c, uint q) { return b_f4[c * (p.K / 4) + q]; }
#endif

#if defined(QUNIT)
#define UNIT 32
#define XQUADS 8
#elif defined(A_Q4_K)
#define UNIT 32
#define XQUADS 8
#elif defined(A_F32)
#define UNIT 4
#define XQUADS 1
#else
#define UNIT 8
#define XQUADS 2
#endif

float acc[ROWS][NCOLS];
#if defined(QUNIT)
uint xq[NCOLS][8];   // the unit's 32 activations of column c, int8, in element order
float xd[NCOLS];     // their block's scale: activation = xd * int8
int xsum[NCOLS][2];  // the sum of each half's 16 int8 values (what the weights' offsets multiply)
#elif defined(X_INT8)
uint xq[NCOLS][2];  // the unit's eight activations of column c, int8, in the order x_quad gives
float xd[NCOLS];    // their block's scale: activation = xd * int8
#if defined(A_Q4_0)
int xsum8[NCOLS];   // 8 * the sum of the eight int8 values (Q4_0 stores weight + 8)
#endif
#else
vec4 xs[NCOLS][XQUADS];
#endif

// The activation quads unit u uses, in the order accumulate() expects them.
uint x_quad(uint u, uint i) {
#if defined(A_Q4_0)
  // low nibbles of qs[4j .. 4j+3]: elements 4j..; high nibbles: elements 16 + 4j ..
  return 8 * (u / 4) + (u % 4) + 4 * i;
#elif defined(A_Q4_K)
  // quants qs[32j + 16h .. +16]: low nibbles -> sub-block 2j, high -> 2j + 1, positions 16h ..
  uint j = (u % 8) / 2, h = u % 2;
  return 64 * (u / 8) + 16 * j + 4 * h + (i / 4) * 8 + (i % 4);
#elif defined(A_F32)
  return u + i;
#else
  return 2 * u + i;
#endif
}

// Small integers become floats without conversion instructions (a quarter of the FP32 rate):
// a 16-bit word w holds fields of 4 or 8 bits; (w & mask) | 0x4B000000 is the float 2^23 +
// field * 2^shift exactly, and one fma with 2^-shift and -(2^23 * 2^-shift + bias) gives
// field - bias exactly.
const float MAGIC = 8388608.0;  // 2^23
vec4 fields4(uint w, float bias) {  // the four nibbles of w, minus bias
  const vec4 scale = vec4(1.0, 1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0);
  return fma(uintBitsToFloat((uvec4(w) & uvec4(0xFu, 0xF0u, 0xF00u, 0xF000u)) | 0x4B000000u), scale, -(MAGIC * scale + bias));
}
vec2 bytes2(uint w) {  // the two signed bytes of w (stored offset by 128 after the xor)
  const vec2 scale = vec2(1.0, 1.0 / 256.0);
  return fma(uintBitsToFloat((uvec2(w ^ 0x8080u) & uvec2(0xFFu, 0xFF00u)) | 0x4B000000u), scale, -(MAGIC * scale + 128.0));
}

#if defined(QUNIT)
// Blocks of 32 (quant_units.glsl): weight = a * q + b in each half, so a half adds
// xd * (a * dot(q, xq) + b * sum(xq)).
void accumulate(uint r, uint row, uint u) {
  uvec2 q[4];
  vec2 a, b;
  block32(row, u, p.K, q, a, b);
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) {
    int dots[2];
    [[unroll]] for (uint h = 0; h < 2; ++h) {
      dots[h] = dot4x8(q[2 * h].x, xq[c][4 * h]) + dot4x8(q[2 * h].y, xq[c][4 * h + 1]) +
                dot4x8(q[2 * h + 1].x, xq[c][4 * h + 2]) + dot4x8(q[2 * h + 1].y, xq[c][4 * h + 3]);
    }
    acc[r][c] += xd[c] * (a.x * float(dots[0]) + a.y * float(dots[1]) + b.x * float(xsum[c][0]) + b.y * float(xsum[c][1]));
  }
}
#elif defined(A_F32)
layout(binding = 0) readonly buffer W { vec4 w4[]; };
void accumulate(uint r, uint row, uint u) {
  vec4 w = w4[row * (p.K / 4) + u];
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] += dot(w, xs[c][0]);
}
#elif defined(A_F16)
layout(binding = 0) readonly buffer W { uvec4 w8[]; };
void accumulate(uint r, uint row, uint u) {
  uvec4 v = w8[row * (p.K / 8) + u];
  vec4 w0 = vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y)), w1 = vec4(unpackHalf2x16(v.z), unpackHalf2x16(v.w));
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] += dot(w0, xs[c][0]) + dot(w1, xs[c][1]);
}
#elif defined(A_BF16)
layout(binding = 0) readonly buffer W { uvec4 w8[]; };
vec4 bf16x4(uint a, uint b) {
  return uintBitsToFloat(uvec4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
}
void accumulate(uint r, uint row, uint u) {
  uvec4 v = w8[row * (p.K / 8) + u];
  vec4 w0 = bf16x4(v.x, v.y), w1 = bf16x4(v.z, v.w);
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] += dot(w0, xs[c][0]) + dot(w1, xs[c][1]);
}
#elif defined(A_Q8_0) && defined(X_INT8)
layout(binding = 0) readonly buffer W { uint16_t w16[]; };
void accumulate(uint r, uint row, uint u) {
  uint h = 17 * (row * (p.K / 32) + u / 4);
  uint q = h + 1 + 4 * (u % 4);
  float d = unpackHalf2x16(uint(w16[h])).x;
  uint w0 = uint(w16[q]) | (uint(w16[q + 1]) << 16), w1 = uint(w16[q + 2]) | (uint(w16[q + 3]) << 16);
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] += d * xd[c] * float(dot4x8(w0, xq[c][0]) + dot4x8(w1, xq[c][1]));
}
#elif defined(A_Q4_0) && defined(X_INT8)
layout(binding = 0) readonly buffer W { uint16_t w16[]; };
void accumulate(uint r, uint row, uint u) {
  uint h = 9 * (row * (p.K / 32) + u / 4);
  uint q = h + 1 + 2 * (u % 4);
  float d = unpackHalf2x16(uint(w16[h])).x;
  // qs[4j .. 4j+3]: the low nibbles are elements 4j.., the high ones 16 + 4j.. (x_quad's order)
  uint w = uint(w16[q]) | (uint(w16[q + 1]) << 16);
  uint lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
  [[unroll]] for (uint c = 0; c < NCOLS; ++c)
    acc[r][c] += d * xd[c] * float(dot4x8(lo, xq[c][0]) + dot4x8(hi, xq[c][1]) - xsum8[c]);
}
#elif defined(A_Q8_0)
// block of 32 (17 halfwords): f16 d, int8 qs[32]
layout(binding = 0) readonly buffer W { uint16_t w16[]; };
void accumulate(uint r, uint row, uint u) {
  uint h = 17 * (row * (p.K / 32) + u / 4);
  uint q = h + 1 + 4 * (u % 4);
  float d = unpackHalf2x16(uint(w16[h])).x;
  vec4 w0 = vec4(bytes2(uint(w16[q])), bytes2(uint(w16[q + 1])));
  vec4 w1 = vec4(bytes2(uint(w16[q + 2])), bytes2(uint(w16[q + 3])));
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] += d * (dot(w0, xs[c][0]) + dot(w1, xs[c][1]));
}
#elif defined(A_Q4_0)
// block of 32 (9 halfwords): f16 d, uint8 qs[16]; x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8)
layout(binding = 0) readonly buffer W { uint16_t w16[]; };
void accumulate(uint r, uint row, uint u) {
  uint h = 9 * (row * (p.K / 32) + u / 4);
  uint q = h + 1 + 2 * (u % 4);
  float d = unpackHalf2x16(uint(w16[h])).x;
  // a: qs[4j] lo, qs[4j] hi, qs[4j+1] lo, qs[4j+1] hi; b: the same for qs[4j+2], qs[4j+3]
  vec4 a = fields4(uint(w16[q]), 8.0), b = fields4(uint(w16[q + 1]), 8.0);
  vec4 w0 = vec4(a.xz, b.xz), w1 = vec4(a.yw, b.yw);
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] += d * (dot(w0, xs[c][0]) + dot(w1, xs[c][1]));
}
#elif defined(A_Q4_K)
// super-block of 256 (nine 16-byte words): f16 d, f16 dmin, uint8 scales[12], uint8 qs[128].
// Sub-block s uses nibble s & 1 of qs[32 * (s / 2) + l]: x = d * scale(s) * nibble - dmin * min(s).
layout(binding = 0) readonly buffer W { uvec4 w16b[]; };
uint scale_byte(uvec4 hdr, uint i) { return (hdr[1 + i / 4] >> (8 * (i % 4))) & 0xFFu; }
void scale_min(uvec4 hdr, uint s, out float sc, out float mn) {
  if (s < 4) {
    sc = float(scale_byte(hdr, s) & 63u);
    mn = float(scale_byte(hdr, s + 4) & 63u);
  } else {
    uint hi = scale_byte(hdr, s + 4);
    sc = float((hi & 15u) | ((scale_byte(hdr, s - 4) >> 6) << 4));
    mn = float((hi >> 4) | ((scale_byte(hdr, s) >> 6) << 4));
  }
}
void accumulate(uint r, uint row, uint u) {
  uint sb = row * (p.K / 256) + u / 8;
  uint j = (u % 8) / 2, hf = u % 2;
  uvec4 hdr = w16b[9 * sb];
  uvec4 qv = w16b[9 * sb + 1 + 2 * j + hf];
  vec2 dm = unpackHalf2x16(hdr.x);
  float sc0, mn0, sc1, mn1;
  scale_min(hdr, 2 * j, sc0, mn0);
  scale_min(hdr, 2 * j + 1, sc1, mn1);
  float d0 = dm.x * sc0, m0 = dm.y * mn0, d1 = dm.x * sc1, m1 = dm.y * mn1;
  vec4 lo[4], hi[4];
  for (uint i = 0; i < 4; ++i) {
    lo[i] = vec4((uvec4(qv[i]) >> uvec4(0, 8, 16, 24)) & 15u);
    hi[i] = vec4((uvec4(qv[i]) >> uvec4(4, 12, 20, 28)) & 15u);
  }
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) {
    float slo = 0.0, shi = 0.0;
    vec4 xlo = vec4(0.0), xhi = vec4(0.0);
    for (uint i = 0; i < 4; ++i) {
      slo += dot(lo[i], xs[c][i]);
      shi += dot(hi[i], xs[c][4 + i]);
      xlo += xs[c][i];
      xhi += xs[c][4 + i];
    }
    acc[r][c] += d0 * slo - m0 * dot(xlo, vec4(1.0)) + d1 * shi - m1 * dot(xhi, vec4(1.0));
  }
}
#endif

#if defined(A_Q4_0) && defined(X_INT8) && !defined(QUNIT)
// 8 * the sum of column c's eight int8 values, which Q4_0's offset of 8 takes off the dot products.
void set_xsum8(uint c) { xsum8[c] = 8 * (dot4x8(xq[c][0], 0x01010101u) + dot4x8(xq[c][1], 0x01010101u)); }
#endif

#if defined(B_Q8)
// Loads the unit's quantized activations: Q8_0's unit is eight consecutive bytes (two words),
// Q4_0's the words of elements 4j.. and 16 + 4j.. of its block (j = u % 4).
void load_unit(uint u) {
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) {
#if defined(QUNIT)
    [[unroll]] for (uint h = 0; h < 2; ++h) {
      const uvec4 w = xw4[c * (p.K / 16) + 2 * u + h];
      xq[c][4 * h] = w.x;
      xq[c][4 * h + 1] = w.y;
      xq[c][4 * h + 2] = w.z;
      xq[c][4 * h + 3] = w.w;
      xsum[c][h] = dot4x8(w.x, 0x01010101u) + dot4x8(w.y, 0x01010101u) + dot4x8(w.z, 0x01010101u) +
                   dot4x8(w.w, 0x01010101u);
    }
#elif defined(A_Q8_0)
    uvec2 w = xw2[c * (p.K / 8) + u];
    xq[c][0] = w.x;
    xq[c][1] = w.y;
#else
    uint base = c * (p.K / 4) + 8 * (u / 4) + u % 4;
    xq[c][0] = xw[base];
    xq[c][1] = xw[base + 4];
    set_xsum8(c);
#endif
    xd[c] = x_scale[p.ncols * (p.K / 4) + c * (p.K / 32) + u / (32 / UNIT)];
  }
}
#elif defined(X_INT8)
// Quantizes the unit's activations. The four units of a block sit on four neighbouring threads
// (u = tid + i * workgroup size, the workgroup a multiple of 4), as int8_blocks.glsl needs.
void load_unit(uint u) {
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) {
    vec4 a = load_x4(c, x_quad(u, 0)), b = load_x4(c, x_quad(u, 1));
    const float amax = block_amax(a, b);
    const uvec2 bytes = block_bytes(a, b, amax);
    xq[c][0] = bytes.x;
    xq[c][1] = bytes.y;
    xd[c] = block_scale(amax);
#if defined(A_Q4_0)
    set_xsum8(c);
#endif
  }
}
#else
void load_unit(uint u) {
  [[unroll]] for (uint c = 0; c < NCOLS; ++c)
    for (uint i = 0; i < XQUADS; ++i) xs[c][i] = load_x4(c, x_quad(u, i));
}
#endif

// One partial sum per (row, column, subgroup); subgroups are at least 4 wide.
shared float partials[ROWS * NCOLS][gl_WorkGroupSize.x / 4];

// Output i (row i / NCOLS, column i % NCOLS): its subgroups' partial sums, in subgroup order.
float output_sum(uint i) {
  float s = 0.0;
  for (uint g = 0; g < gl_NumSubgroups; ++g) s += partials[i][g];
  return s;
}

#if defined(B_RMSNORM)
shared float norm_partials[NCOLS][gl_WorkGroupSize.x / 4];
void find_row_scales(uint tid) {
  [[unroll]] for (uint c = 0; c < NCOLS; ++c) {
    float ss = 0.0;
    for (uint q = tid; q < p.K / 4; q += gl_WorkGroupSize.x) {
      vec4 v = x4[c * (p.K / 4) + q];
      ss += dot(v, v);
    }
    ss = subgroupAdd(ss);
    if (subgroupElect()) norm_partials[c][gl_SubgroupID] = ss;
  }
  barrier();
  if (tid < NCOLS) {
    float total = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; ++g) total += norm_partials[tid][g];
    inv_rms[tid] = inversesqrt(total / float(p.K) + p.eps);
  }
  barrier();
}
#endif

void main() {
  uint row0 = flat_group() * ROWS;
  uint tid = gl_LocalInvocationIndex;
#if defined(IQ4_SHARED_LEVELS) && (defined(A_IQ4_NL) || defined(A_IQ4_XS))
  init_iq4_levels();
#endif
#if defined(B_RMSNORM)
  find_row_scales(tid);
#endif
  [[unroll]] for (uint r = 0; r < ROWS; ++r)
    [[unroll]] for (uint c = 0; c < NCOLS; ++c) acc[r][c] = 0.0;

  uint units = p.K / UNIT;
  for (uint u = tid; u < units; u += gl_WorkGroupSize.x) {
    load_unit(u);
    // Rows past M read row M - 1 (kept in bounds) and are not written.
    [[unroll]] for (uint r = 0; r < ROWS; ++r) accumulate(r, min(row0 + r, p.M - 1), u);
  }

  [[unroll]] for (uint r = 0; r < ROWS; ++r) {
    [[unroll]] for (uint c = 0; c < NCOLS; ++c) {
      float s = subgroupAdd(acc[r][c]);
      if (subgroupElect()) partials[r * NCOLS + c][gl_SubgroupID] = s;
    }
  }
  barrier();
#if defined(ROPE_KV)
  for (uint i = tid; i < (ROWS / 2) * NCOLS; i += gl_WorkGroupSize.x) {
    const uint r = 2 * (i / NCOLS), c = i % NCOLS, row = row0 + r;
    if (row + 1 >= p.M) continue;  // M is even: a pair is inside or wholly past it
    float s0 = output_sum(r * NCOLS + c), s1 = output_sum((r + 1) * NCOLS + c);
    const uint pair = (row % p.head_dim) / 2;
    if (p.mode != 2u && 2 * pair < p.n_dims) {
      const vec2 turned = rope_turn(s0, s1, positions[c], freqs[pair], p.mscale);
      s0 = turned.x;
      s1 = turned.y;
    }
    if (p.mode == 0u) {
      out_data[c * p.M + row] = s0;
      out_data[c * p.M + row + 1] = s1;
    } else {
      const uint o = slots[c] * p.M + row;
      out_h[o] = float16_t(s0);
      out_h[o + 1] = float16_t(s1);
    }
  }
  return;
#endif
  for (uint i = tid; i < ROWS * NCOLS; i += gl_WorkGroupSize.x) {
    uint r = i / NCOLS, c = i % NCOLS;
    if (row0 + r < p.M) {
      const float s = output_sum(i);
      uint o = c * p.M + row0 + r;
      out_data[o] = ACCUMULATE != 0u ? out_data[o] + s : s;
    }
  }
}
