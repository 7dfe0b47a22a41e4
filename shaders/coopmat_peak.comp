#version 450
// What the tensor cores do through VK_NV_cooperative_matrix with nothing else in the way, for
// `mqlm bench kernels` to set the staged matmul against (built only for devices that report it).
// Every subgroup multiplies fragments into TM x TN independent F32 accumulators, p.iterations
// times. Without FROM_SHARED the operands stay in registers (the peak). With it, every iteration
// first loads TM fragments of A and TN of B from shared memory, as mul_mm_staged.comp's inner loop
// does (rows of STRIDE 16-byte words, B column-major). Typing the arrays float16_t instead of
// uvec4, or B row-major, measured the same on the H100 (bench/results/tensor-cores-2026-11-26-h100.md).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform Params { uint iterations; } p;
layout(binding = 0) buffer Out { float out_data[]; };

#if !defined(TM)
#define TM 2
#define TN 4
#endif
#if !defined(STRIDE)
#define STRIDE 9
#endif
const uint ACC = TM * TN;

#if defined(FROM_SHARED)
shared uvec4 tile_a[4 * TM * 16 * STRIDE];
shared uvec4 tile_b[TN * 16 * STRIDE];
uvec4 ones_and_zeros(uint i) { return uvec4(0x3C003C00u * (i & 1u)); }
#endif

void main() {
  const uint sg = gl_SubgroupID;
  fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> acc[ACC];
  [[unroll]] for (uint i = 0; i < ACC; ++i) acc[i] = fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>(0.0);
#if defined(FROM_SHARED)
  for (uint i = gl_LocalInvocationIndex; i < tile_a.length(); i += gl_WorkGroupSize.x) tile_a[i] = ones_and_zeros(i);
  for (uint i = gl_LocalInvocationIndex; i < tile_b.length(); i += gl_WorkGroupSize.x) tile_b[i] = ones_and_zeros(i);
  barrier();
  for (uint it = 0; it < p.iterations; ++it) {
    const uint h = it % 4;  // walk the row's words as the staged kernel's h loop does
    fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a[TM];
    [[unroll]] for (uint i = 0; i < TM; ++i) {
      coopMatLoadNV(a[i], tile_a, (sg * TM * 16 + 16 * i) * STRIDE + 2 * h, STRIDE, false);
    }
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> b;
      coopMatLoadNV(b, tile_b, (CM_N * j) * STRIDE + 2 * h, STRIDE, true);
      [[unroll]] for (uint i = 0; i < TM; ++i) acc[i * TN + j] = coopMatMulAddNV(a[i], b, acc[i * TN + j]);
    }
  }
#else
  const fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a = fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K>(float16_t(0.001 * float(sg + 1)));
  const fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> b = fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N>(float16_t(0.002));
  for (uint it = 0; it < p.iterations; ++it) {
    [[unroll]] for (uint i = 0; i < ACC; ++i) acc[i] = coopMatMulAddNV(a, b, acc[i]);
  }
#endif
  // Every accumulator stored (glslc 2023.2 crashes optimising a sum of cooperative matrices).
  const uint base = (flat_group() * gl_NumSubgroups + sg) * ACC * CM_M * CM_N;
  [[unroll]] for (uint i = 0; i < ACC; ++i) coopMatStoreNV(acc[i], out_data, base + i * CM_M * CM_N, CM_M, false);
}
