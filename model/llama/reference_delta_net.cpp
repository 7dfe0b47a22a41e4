// qwen35's Gated DeltaNet layer in the CPU reference, as llama.cpp computes it (qwen35.cpp's
// build_layer_attn_linear, delta-net-base.cpp, ggml's ssm_conv and gated_delta_net), one token
// after another in double precision:
//   qkv = W_qkv x, then a causal convolution of conv_kernel taps per channel over the layer's last
//   inputs (the state's) and these, then silu; q, k and v are its parts, q and k L2-normalised
//   per head;
//   per value head h (reading key head h % ssm_k_heads): decay = exp(softplus(W_alpha x + dt_bias)
//   * ssm_a), strength beta = sigmoid(W_beta x), and with S the head's (value, key) state matrix:
//     S *= decay;  d = beta (v - S k);  S += d k^T;  o = S q / sqrt(head_dim)
//   out = W_out (rms_norm(o, ssm_norm) * silu(W_gate x)), each head normed on its own.
#include <cmath>

#include "gpu/reference_ops.hpp"
#include "model/llama/reference_model.hpp"

namespace mqlm::model {

namespace ref = gpu::reference;
using Vec = std::vector<float>;

namespace {

double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The convolution over (tokens, channels) inputs, the state's (kernel - 1) before them; silu of
// each output. The state becomes the last (kernel - 1) inputs.
Vec causal_conv_silu(const Vec& taps, std::size_t kernel, const Vec& x, std::size_t tokens, Vec& state) {
  const std::size_t channels = x.size() / tokens, past = kernel - 1;
  Vec window(state);  // (past + tokens, channels)
  window.insert(window.end(), x.begin(), x.end());
  Vec out(tokens * channels);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t c = 0; c < channels; ++c) {
      double sum = 0;
      for (std::size_t i = 0; i < kernel; ++i) sum += double{window[(t + i) * channels + c]} * taps[c * kernel + i];
      out[t * channels + c] = static_cast<float>(sum * sigmoid(sum));
    }
  }
  state.assign(window.end() - static_cast<std::ptrdiff_t>(past * channels), window.end());
  return out;
}

// The dim values from offset, divided by sqrt(sum x^2 + eps) (llama.cpp's L2 norm of a head).
std::vector<double> l2_normed(const Vec& rows, std::size_t offset, std::size_t dim, float eps) {
  double sum = 0;
  for (std::size_t i = 0; i < dim; ++i) sum += double{rows[offset + i]} * rows[offset + i];
  const double scale = 1.0 / std::sqrt(sum + eps);
  std::vector<double> out(dim);
  for (std::size_t i = 0; i < dim; ++i) out[i] = rows[offset + i] * scale;
  return out;
}

// One token through one value head: the state S (dim value rows, dim key columns) decayed and
// updated; returns S q / sqrt(dim) into o.
void delta_rule(float* S, const std::vector<double>& q, const std::vector<double>& k, const float* v, double decay,
                double beta, float* o) {
  const std::size_t dim = q.size();
  for (std::size_t i = 0; i < dim * dim; ++i) S[i] = static_cast<float>(S[i] * decay);
  for (std::size_t r = 0; r < dim; ++r) {
    double sk = 0;
    for (std::size_t c = 0; c < dim; ++c) sk += S[r * dim + c] * k[c];
    const double d = beta * (v[r] - sk);
    double out = 0;
    for (std::size_t c = 0; c < dim; ++c) {
      S[r * dim + c] = static_cast<float>(S[r * dim + c] + d * k[c]);
      out += S[r * dim + c] * q[c];
    }
    o[r] = static_cast<float>(out / std::sqrt(static_cast<double>(dim)));
  }
}

}  // namespace

std::vector<float> ReferenceSequence::delta_net_block(const ReferenceLayer& layer, RecurrentState& state, const Vec& x,
                                                      std::size_t n) const {
  const LlamaConfig& c = model_.config;
  const std::size_t dim = c.ssm_head_dim, heads = c.ssm_v_heads, key = c.ssm_key_dim(), channels = c.ssm_conv_dim();
  const Vec in = product_input(x);
  const Vec qkv = causal_conv_silu(layer.ssm_conv, c.ssm_conv_kernel, ref::matmul(layer.ssm_qkv, in, channels, c.n_embd, n),
                                   n, state.conv);  // (tokens, conv_dim)
  const Vec z = ref::matmul(layer.ssm_gate, in, c.ssm_value_dim(), c.n_embd, n);
  const Vec beta = ref::matmul(layer.ssm_beta, in, heads, c.n_embd, n);
  const Vec alpha = ref::matmul(layer.ssm_alpha, in, heads, c.n_embd, n);
  Vec o(n * c.ssm_value_dim());  // (tokens, v_heads, head_dim)
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t kh = h % c.ssm_k_heads, row = t * channels;
      const double decay = std::exp(softplus(double{alpha[t * heads + h]} + layer.ssm_dt_bias[h]) * layer.ssm_a[h]);
      delta_rule(state.delta.data() + h * dim * dim, l2_normed(qkv, row + kh * dim, dim, c.rms_eps),
                 l2_normed(qkv, row + key + kh * dim, dim, c.rms_eps), qkv.data() + row + 2 * key + h * dim, decay,
                 sigmoid(beta[t * heads + h]), o.data() + (t * heads + h) * dim);
    }
  }
  const Vec gated = ref::silu_mul(z, ref::rms_norm(o, layer.ssm_norm, n * heads, dim, c.rms_eps));
  return ref::matmul(layer.ssm_out, product_input(gated), c.n_embd, c.ssm_value_dim(), n);
}

}  // namespace mqlm::model
