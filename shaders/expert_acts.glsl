// The activations of a mixture of experts' products (binding 1): load_b4(row, q) is elements
// 4q .. 4q+3 of row `row` of p.K, zeros past K. F32 rows, or with B_Q8 as quantize_q8 makes them
// (the bytes of all p.cols rows, then their blocks' scales; K whole blocks of 32), which rounds
// them as llama.cpp rounds a quantized product's. The shader's push constants name K and cols.
#if defined(B_Q8)
layout(binding = 1) readonly buffer ActsBytes { int8_t b_i8[]; };
layout(binding = 1) readonly buffer ActsScales { float b_scale[]; };
vec4 load_b4(uint row, uint q) {
  uint base = row * p.K + 4 * q;
  float d = b_scale[p.cols * p.K / 4 + base / 32];
  return d * vec4(b_i8[base], b_i8[base + 1], b_i8[base + 2], b_i8[base + 3]);
}
#else
layout(binding = 1) readonly buffer Acts { float b[]; };
vec4 load_b4(uint row, uint q) {
  uint k = 4 * q, base = row * p.K + k;
  if (k + 3 < p.K) return vec4(b[base], b[base + 1], b[base + 2], b[base + 3]);
  vec4 v = vec4(0.0);
  for (uint j = 0; j < 4; ++j) {
    if (k + j < p.K) v[j] = b[base + j];
  }
  return v;
}
#endif
