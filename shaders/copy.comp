#version 450
// dst = src in 16-byte words: the device's copy bandwidth, the roofline the kernels are held to.
layout(local_size_x = 256) in;
layout(push_constant) uniform Params { uint words; } p;
layout(binding = 0) readonly buffer Src { uvec4 src[]; };
layout(binding = 1) writeonly buffer Dst { uvec4 dst[]; };

void main() {
  uint stride = gl_NumWorkGroups.x * 256;
  for (uint i = gl_GlobalInvocationID.x; i < p.words; i += stride) dst[i] = src[i];
}
