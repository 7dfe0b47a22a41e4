#version 450
// dst = src in 16-byte words: the device's copy bandwidth, the roofline the kernels are held to.
// With GATHER: chunks of `chunk` words, chunk index[i] of src into dst at word base + i * stride,
// one workgroup a chunk (KV pages spilled to the host: each page's K or V rows of one layer into
// its place in the page's host bytes; a copy command listing those as regions took ~2 us a region).
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer Src { uvec4 src[]; };
layout(binding = 1) writeonly buffer Dst { uvec4 dst[]; };
#if defined(GATHER)
#include "common.glsl"
layout(binding = 2) readonly buffer Index { uint index[]; };
layout(push_constant) uniform Params { uint chunk; uint count; uint base; uint stride; } p;

void main() {
  const uint i = flat_group();
  if (i >= p.count) return;
  const uint from = index[i] * p.chunk, to = p.base + i * p.stride;
  for (uint w = gl_LocalInvocationID.x; w < p.chunk; w += 256) dst[to + w] = src[from + w];
}
#else
layout(push_constant) uniform Params { uint words; } p;

void main() {
  uint stride = gl_NumWorkGroups.x * 256;
  for (uint i = gl_GlobalInvocationID.x; i < p.words; i += stride) dst[i] = src[i];
}
#endif
