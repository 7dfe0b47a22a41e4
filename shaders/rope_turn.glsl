// The rotary embedding's turn of one pair (x0, x1) at position pos: by pos * freq, freq the pair's
// angle per position (ops::rope_frequencies: the base's frequency, scaled as the model's RoPE
// scaling says), cos and sin multiplied by mscale (ops::rope_magnitude: YaRN's, 1 otherwise).
// Shared by rope.comp and the mat-vec that turns q and k as it writes them (mul_mat_vec_blocks.comp,
// ROPE_KV).
vec2 rope_turn(float x0, float x1, int pos, float freq, float mscale) {
  const float theta = float(pos) * freq;
  const float c = cos(theta) * mscale, s = sin(theta) * mscale;
  return vec2(x0 * c - x1 * s, x0 * s + x1 * c);
}
