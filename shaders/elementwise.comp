#version 450
// out = a + b (ADD), out = silu(a) * b (SILU_MUL, a the gate), out = gelu(a) * b (GELU_MUL, the
// tanh form: GeGLU), out = a * p.value (SCALE) or out = p.value tanh(a / p.value) (SOFT_CAP), over
// n elements (b unread by the last two).
// SILU_MUL_F16: out is F16 and runs to p.total elements, those past n zero: the input of the
// tensor-core matmuls, which read whole column tiles (what to_f16 would make of the F32 result).
#include "common.glsl"

layout(local_size_x = 256) in;
#if defined(SILU_MUL_F16)
layout(push_constant) uniform Params { uint n; uint total; } p;
layout(binding = 2) writeonly buffer Out { float16_t out_data[]; };
#elif defined(SCALE) || defined(SOFT_CAP)
layout(push_constant) uniform Params { uint n; float value; } p;
layout(binding = 2) writeonly buffer Out { float out_data[]; };
#else
layout(push_constant) uniform Params { uint n; } p;
layout(binding = 2) writeonly buffer Out { float out_data[]; };
#endif
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };

void main() {
  uint i = flat_group() * 256 + gl_LocalInvocationIndex;
#if defined(SILU_MUL_F16)
  if (i >= p.total) return;
  if (i >= p.n) {
    out_data[i] = float16_t(0.0);
    return;
  }
  float g = a[i];
  out_data[i] = float16_t(g / (1.0 + exp(-g)) * b[i]);
#else
  if (i >= p.n) return;
#if defined(SILU_MUL)
  float g = a[i];
  out_data[i] = g / (1.0 + exp(-g)) * b[i];
#elif defined(GELU_MUL)
  out_data[i] = gelu_tanh(a[i]) * b[i];
#elif defined(SCALE)
  out_data[i] = a[i] * p.value;
#elif defined(SOFT_CAP)
  out_data[i] = soft_cap(a[i], p.value);
#else
  out_data[i] = a[i] + b[i];
#endif
#endif
}
