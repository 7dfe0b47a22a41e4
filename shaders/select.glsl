// Ordering for argmax and top-k: the larger value wins, ties go to the lower index (so the
// CPU reference and the GPU agree exactly); a slot with index NO_INDEX loses to everything.
#define NO_INDEX 0xFFFFFFFFu
bool better(float v1, uint i1, float v2, uint i2) {
  if (i2 == NO_INDEX) return i1 != NO_INDEX;
  if (i1 == NO_INDEX) return false;
  return v1 > v2 || (v1 == v2 && i1 < i2);
}
