#version 450
// Where the driver keeps the elements of cooperative-matrix fragments: one subgroup loads a 16x16
// F16 A fragment, a 16x8 F16 B fragment and a 16x8 F32 accumulator whose elements are their own
// row-major indices, and each invocation writes the elements it holds, in order. The host
// (gpu/fragment_layout.cpp) compares them with the layout shaders/mul_mm_direct.comp builds its
// fragments in (NVIDIA's: gpu/fragment_layout.hpp).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "common.glsl"

layout(local_size_x = 32) in;
layout(binding = 0) readonly buffer Src16 { float16_t src16[]; };  // 0, 1, .., 255
layout(binding = 1) readonly buffer Src32 { float src32[]; };      // 0, 1, .., 127
// A's elements (8 an invocation), then B's, then the accumulator's (4 each), then the three lengths.
layout(binding = 2) writeonly buffer Out { float out_data[]; };

void main() {
  const uint lane = gl_SubgroupInvocationID;
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;  // M x K
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;   // K x N
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> c;   // M x N
  coopMatLoadNV(a, src16, 0, 16, false);
  coopMatLoadNV(b, src16, 0, 8, false);
  coopMatLoadNV(c, src32, 0, 8, false);
  for (uint e = 0; e < a.length() && e < 8; ++e) out_data[lane * 8 + e] = float(a[e]);
  for (uint e = 0; e < b.length() && e < 4; ++e) out_data[256 + lane * 4 + e] = float(b[e]);
  for (uint e = 0; e < c.length() && e < 4; ++e) out_data[384 + lane * 4 + e] = c[e];
  if (lane == 0) {
    out_data[512] = float(a.length());
    out_data[513] = float(b.length());
    out_data[514] = float(c.length());
  }
}
