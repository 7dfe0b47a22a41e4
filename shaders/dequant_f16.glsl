// Q4_0 and Q8_0 blocks to F16 on packed halves: a nibble (or a byte, biased by 128) becomes the
// mantissa of 1024.0 by bit operations, then one subtraction and one multiplication give two
// weights at a time, each rounded once (as d * q in F32, then to F16, would be).
// Used by mul_mm_staged.comp (into shared memory) and dequant_f16.comp (into a buffer).

// Two F16 in one word (the first in the low bits).
uint halves(f16vec2 v) { return packFloat2x16(v); }

// Half `half_` of a Q4_0 block: scale d and quant bytes qs[8 * half_ .. 8 * half_ + 7] as two
// little-endian words. lo: weights 8 * half_ + j (low nibbles), hi: 16 + 8 * half_ + j (high), j < 8.
void q4_0_half_to_f16(float16_t d, uint x0, uint x1, out uvec4 lo, out uvec4 hi) {
  uint l[4], h[4];
  [[unroll]] for (uint w = 0; w < 2; ++w) {
    const uint x = w == 0 ? x0 : x1;
    // Nibble pairs (j, j + 1) placed in the mantissas of two halves of 1024.0, then (q - 8) * d.
    const uint pairs[4] = uint[4]((x & 0xFu) | ((x << 8) & 0xF0000u), ((x >> 16) & 0xFu) | ((x >> 8) & 0xF0000u),
                                  ((x >> 4) & 0xFu) | ((x << 4) & 0xF0000u), ((x >> 20) & 0xFu) | ((x >> 12) & 0xF0000u));
    [[unroll]] for (uint j = 0; j < 2; ++j) {
      l[2 * w + j] = halves((unpackFloat2x16(pairs[j] | 0x64006400u) - float16_t(1032.0)) * d);
      h[2 * w + j] = halves((unpackFloat2x16(pairs[2 + j] | 0x64006400u) - float16_t(1032.0)) * d);
    }
  }
  lo = uvec4(l[0], l[1], l[2], l[3]);
  hi = uvec4(h[0], h[1], h[2], h[3]);
}

// Two quant bytes of a Q8_0 block (a little-endian halfword) to two F16: q * d.
uint q8_0_pair_to_f16(float16_t d, uint x) {
  const uint pair = (((x & 0xFFu) | ((x << 8) & 0xFF0000u)) ^ 0x00800080u) | 0x64006400u;
  return halves((unpackFloat2x16(pair) - float16_t(1152.0)) * d);
}
