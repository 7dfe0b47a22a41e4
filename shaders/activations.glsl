// The activations a matrix multiplication reads: (ncols, K), K contiguous, F32 or (B_F16) F16.
#if defined(B_F16)
layout(binding = B_BINDING) readonly buffer ActsF16 { float16_t b_data[]; };
#else
layout(binding = B_BINDING) readonly buffer ActsF32 { float b_data[]; };
#endif

// Elements 4q .. 4q+3 of activation row `col`, zeros past K.
vec4 load_b4(uint col, uint q, uint K) {
  uint k = 4 * q;
  uint base = col * K + k;
  if (k + 3 < K) return vec4(float(b_data[base]), float(b_data[base + 1]), float(b_data[base + 2]), float(b_data[base + 3]));
  vec4 v = vec4(0.0);
  for (uint j = 0; j < 4; ++j) {
    if (k + j < K) v[j] = float(b_data[base + j]);
  }
  return v;
}
