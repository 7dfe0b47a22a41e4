#version 450
// qwen35's gated delta rule (ops::delta_rule, reference::delta_rule): one workgroup per (sequence,
// value head), one thread per value row r of the head's state S (value rows, key columns; element
// (r, c) at c * dim + r, so that the threads read consecutive words), which the thread alone reads
// and writes in place; the tokens in order. Per token: q and k of the key
// head into shared memory and L2-normalised (every thread sums them itself: head_dim reads, as
// many as its row costs), then
//   sk = decay * S[r] . k;  d = beta (v[r] - sk);  S[r] = decay * S[r] + d k;  out[r] = S[r] . q / sqrt(dim)
#include "common.glsl"

layout(local_size_x_id = 0) in;  // head_dim threads
layout(binding = 0) readonly buffer Qkv { float qkv[]; };      // (sequences x tokens, conv_dim)
layout(binding = 1) readonly buffer Alpha { float alpha[]; };  // (sequences x tokens, v_heads)
layout(binding = 2) readonly buffer Beta { float beta_raw[]; };
layout(binding = 3) readonly buffer DtBias { float dt_bias[]; };  // (v_heads)
layout(binding = 4) readonly buffer Rate { float rate[]; };       // (v_heads): ssm_a
layout(binding = 5) buffer State { float state[]; };              // (slots, v_heads, dim key, dim value)
layout(binding = 6) readonly buffer Slots { uint slots[]; };
layout(binding = 7) writeonly buffer Out { float out_data[]; };   // (sequences x tokens, v_heads x dim)
layout(push_constant) uniform Params { uint tokens; uint k_heads; uint v_heads; uint dim; float eps; } p;

const uint MAX_DIM = 256;  // ops::delta_net_max_head_dim
shared float q_s[MAX_DIM];
shared float k_s[MAX_DIM];

float softplus(float v) { return v > 20.0 ? v : log(1.0 + exp(v)); }

void main() {
  const uint h = gl_WorkGroupID.x, s = gl_WorkGroupID.y, r = gl_LocalInvocationID.x, dim = p.dim;
  const uint key = p.k_heads * dim, channels = 2 * key + p.v_heads * dim, kh = h % p.k_heads;
  const uint S = (slots[s] * p.v_heads + h) * dim * dim + r;  // this thread's row, element c at S + c * dim
  const float scale = inversesqrt(float(dim));
  for (uint t = 0; t < p.tokens; ++t) {
    const uint token = s * p.tokens + t, row = token * channels;
    barrier();  // the previous token's reads of q_s and k_s are done
    q_s[r] = qkv[row + kh * dim + r];
    k_s[r] = qkv[row + key + kh * dim + r];
    barrier();
    float qq = 0.0, kk = 0.0;
    for (uint c = 0; c < dim; ++c) {
      qq += q_s[c] * q_s[c];
      kk += k_s[c] * k_s[c];
    }
    const float qn = inversesqrt(qq + p.eps), kn = inversesqrt(kk + p.eps);
    const float decay = exp(softplus(alpha[token * p.v_heads + h] + dt_bias[h]) * rate[h]);
    const float b = 1.0 / (1.0 + exp(-beta_raw[token * p.v_heads + h]));
    float sk = 0.0;
    for (uint c = 0; c < dim; ++c) sk += state[S + c * dim] * k_s[c];
    const float d = b * (qkv[row + 2 * key + h * dim + r] - decay * sk * kn);
    float o = 0.0;
    for (uint c = 0; c < dim; ++c) {
      const float v = decay * state[S + c * dim] + d * k_s[c] * kn;
      state[S + c * dim] = v;
      o += v * q_s[c];
    }
    out_data[token * p.v_heads * dim + h * dim + r] = o * qn * scale;
  }
}
