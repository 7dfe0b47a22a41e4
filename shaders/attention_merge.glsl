// The merge of attention_split.comp's partial softmaxes, element d of output row `row` (token *
// heads + head): sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M) with M the largest m_s. Empty
// splits carry m = -inf, l = 0, o = 0. The includer declares D and the buffer `partials`, laid out
// as attention_split.comp writes it.
float merge_splits(uint row, uint d, uint tokens, uint heads, uint splits) {
  const uint ml = tokens * heads * splits * D + row * splits * 2;
  float m = -1.0 / 0.0;
  for (uint s = 0; s < splits; ++s) m = max(m, partials[ml + 2 * s]);
  float l = 0.0, o = 0.0;
  for (uint s = 0; s < splits; ++s) {
    float w = exp(partials[ml + 2 * s] - m);
    l += partials[ml + 2 * s + 1] * w;
    o += partials[(row * splits + s) * D + d] * w;
  }
  return o / l;
}
