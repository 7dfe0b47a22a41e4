// The rotary embedding's turn of one pair (x0, x1): pair i of the first n_dims dimensions of a
// head, at position pos, turns by pos * freq_scale * freq_base^(-2i / n_dims). Shared by rope.comp
// and the mat-vec that turns q and k as it writes them (mul_mat_vec_blocks.comp, ROPE_KV).
vec2 rope_turn(float x0, float x1, int pos, uint i, uint n_dims, float freq_base, float freq_scale) {
  float theta = float(pos) * freq_scale * pow(freq_base, -2.0 * float(i) / float(n_dims));
  float c = cos(theta), s = sin(theta);
  return vec2(x0 * c - x1 * s, x0 * s + x1 * c);
}
