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
