// Int8 blocks of 32 activations, as reference::int8_blocks rounds them: each value becomes
// round(v / amax * 127) with amax the block's largest magnitude, and the block keeps the scale
// amax / 127. A thread holds 8 values of a block; the four threads of a block are neighbouring
// lanes (4i .. 4i + 3), all active.
#extension GL_KHR_shader_subgroup_shuffle : require

// The block's largest magnitude, from the four threads' values: two xor shuffles (lavapipe's
// subgroupClusteredMax(v, 4) got this wrong: the tests failed with it).
float block_amax(vec4 a, vec4 b) {
  vec4 m = max(abs(a), abs(b));
  float amax = max(max(m.x, m.y), max(m.z, m.w));
  amax = max(amax, subgroupShuffleXor(amax, 1u));
  return max(amax, subgroupShuffleXor(amax, 2u));
}

// The thread's 8 values as signed bytes (packSnorm4x8 rounds v / amax * 127), 4 to a word.
uvec2 block_bytes(vec4 a, vec4 b, float amax) {
  const float inv = amax > 0.0 ? 1.0 / amax : 0.0;
  return uvec2(packSnorm4x8(a * inv), packSnorm4x8(b * inv));
}

float block_scale(float amax) { return amax * (1.0 / 127.0); }

#if defined(INT8_BLOCKS_OUT)
// The int8 mat-vec's input (mul_mat_vec_blocks.comp with B_Q8) at binding INT8_BLOCKS_OUT: the
// bytes of every column of K elements (as pairs of 32-bit words), then one float scale a block
// from word columns * K / 4 (the layout ops::q8_acts_bytes sizes).
layout(binding = INT8_BLOCKS_OUT) writeonly buffer Int8Bytes { uvec2 q2[]; };
layout(binding = INT8_BLOCKS_OUT) writeonly buffer Int8Scales { float s_out[]; };

// Quantizes elements 8 * unit .. 8 * unit + 7 of column c (v0, v1) and writes them and, from the
// block's first thread, its scale.
void write_int8_unit(vec4 v0, vec4 v1, uint c, uint columns, uint K, uint unit) {
  const float amax = block_amax(v0, v1);
  q2[c * (K / 8) + unit] = block_bytes(v0, v1, amax);
  if (unit % 4 == 0) s_out[columns * (K / 4) + c * (K / 32) + unit / 4] = block_scale(amax);
}
#endif
