#version 450
// qwen35's causal convolution and silu (ops::short_conv): one invocation per (sequence, channel),
// walking the sequence's tokens with a window of the last kernel inputs, the first (kernel - 1)
// from the sequence's state slot, which is left holding the last (kernel - 1) inputs.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer X { float x[]; };         // (sequences x tokens, channels)
layout(binding = 1) readonly buffer Taps { float taps[]; };   // (channels, kernel), oldest first
layout(binding = 2) buffer State { float state[]; };          // (slots, kernel - 1, channels)
layout(binding = 3) readonly buffer Slots { uint slots[]; };  // (sequences)
layout(binding = 4) writeonly buffer Out { float out_data[]; };
layout(push_constant) uniform Params { uint channels; uint kernel; uint tokens; uint sequences; } p;

const uint MAX_KERNEL = 8;  // ops::delta_net_max_kernel

void main() {
  const uint id = flat_group() * 64 + gl_LocalInvocationID.x;
  if (id >= p.channels * p.sequences) return;
  const uint c = id % p.channels, s = id / p.channels, past = p.kernel - 1;
  const uint base = slots[s] * past * p.channels + c;
  float window[MAX_KERNEL];
  float w[MAX_KERNEL];
  for (uint i = 0; i < past; ++i) window[i] = state[base + i * p.channels];
  for (uint i = 0; i < p.kernel; ++i) w[i] = taps[c * p.kernel + i];
  for (uint t = 0; t < p.tokens; ++t) {
    const uint row = (s * p.tokens + t) * p.channels + c;
    window[past] = x[row];
    float sum = 0.0;
    for (uint i = 0; i < p.kernel; ++i) sum += window[i] * w[i];
    out_data[row] = sum / (1.0 + exp(-sum));
    for (uint i = 0; i < past; ++i) window[i] = window[i + 1];
  }
  for (uint i = 0; i < past; ++i) state[base + i * p.channels] = window[i];
}
