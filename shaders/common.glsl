// Shared by every compute shader: the extensions they rely on (all present on lavapipe and the H100).
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

// A flat workgroup index for grids that may exceed 65535 in x (the host spreads them over y).
uint flat_group() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// Gemma's soft cap: cap * tanh(x / cap), the argument clamped where tanh is 1 in F32 already (some
// drivers' tanh overflows to NaN far out).
float soft_cap(float x, float cap) { return cap * tanh(clamp(x / cap, -10.0, 10.0)); }

// GELU, the tanh form (ggml's gelu; Gemma's GeGLU gate).
float gelu_tanh(float x) {
  return 0.5 * x * (1.0 + tanh(clamp(0.7978845608028654 * x * (1.0 + 0.044715 * x * x), -10.0, 10.0)));
}
