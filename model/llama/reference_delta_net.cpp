// qwen35's Gated DeltaNet layer in the CPU reference, as llama.cpp computes it (qwen35.cpp's
// build_layer_attn_linear, delta-net-base.cpp):
//   qkv = W_qkv x, through the causal convolution and silu (reference::short_conv); the gated delta
//   rule per value head (reference::delta_rule), its decay from W_alpha x and its strength from
//   W_beta x;
//   out = W_out (rms_norm(o, ssm_norm) * silu(W_gate x)), each head normed on its own.
#include "gpu/reference_ops.hpp"
#include "model/llama/reference_model.hpp"

namespace mqlm::model {

namespace ref = gpu::reference;
using Vec = std::vector<float>;

std::vector<float> ReferenceSequence::delta_net_block(const ReferenceLayer& layer, RecurrentState& state, const Vec& x,
                                                      std::size_t n) const {
  const LlamaConfig& c = model_.config;
  const auto shape = delta_net_shape(c, 1, static_cast<std::uint32_t>(n));
  const Vec in = product_input(x);
  const Vec qkv = ref::short_conv(ref::matmul(layer.ssm_qkv, in, c.ssm_conv_dim(), c.n_embd, n), layer.ssm_conv,
                                  state.conv, shape);  // (tokens, conv_dim)
  const Vec z = ref::matmul(layer.ssm_gate, in, c.ssm_value_dim(), c.n_embd, n);
  const Vec beta = ref::matmul(layer.ssm_beta, in, c.ssm_v_heads, c.n_embd, n);
  const Vec alpha = ref::matmul(layer.ssm_alpha, in, c.ssm_v_heads, c.n_embd, n);
  const Vec o = ref::delta_rule(qkv, alpha, beta, layer.ssm_dt_bias, layer.ssm_a, state.delta, shape);
  const Vec gated = ref::silu_mul(z, ref::rms_norm(o, layer.ssm_norm, n * c.ssm_v_heads, c.ssm_head_dim, c.rms_eps));
  return ref::matmul(layer.ssm_out, product_input(gated), c.n_embd, c.ssm_value_dim(), n);
}

}  // namespace mqlm::model
