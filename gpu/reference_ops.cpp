#include "gpu/reference_ops.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <utility>

namespace mqlm::gpu::reference {

Vec rms_norm(const Vec& x, const Vec& weight, std::size_t rows, std::size_t n, float eps) {
  Vec out(rows * n);
  for (std::size_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::size_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
    double scale = 1.0 / std::sqrt(ss / n + eps);
    for (std::size_t i = 0; i < n; ++i) out[r * n + i] = static_cast<float>(x[r * n + i] * scale * weight[i]);
  }
  return out;
}

Vec add(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

Vec gelu_mul(const Vec& gate, const Vec& up) {
  Vec out(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(0.7978845608028654 * g * (1.0 + 0.044715 * g * g))) * up[i]);
  }
  return out;
}

Vec soft_cap(const Vec& x, float cap) {
  Vec out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(cap * std::tanh(double{x[i]} / cap));
  return out;
}

Vec silu_mul(const Vec& gate, const Vec& up) {
  Vec out(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
  return out;
}

Vec softmax(const Vec& x, std::size_t rows, std::size_t n, float scale) {
  Vec out(rows * n);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -INFINITY, sum = 0;
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, double(x[r * n + i]) * scale);
    for (std::size_t i = 0; i < n; ++i) sum += std::exp(double(x[r * n + i]) * scale - m);
    for (std::size_t i = 0; i < n; ++i) out[r * n + i] = static_cast<float>(std::exp(double(x[r * n + i]) * scale - m) / sum);
  }
  return out;
}

namespace {
// ggml's rope_yarn for pair i at angle theta_extrap (the base's frequency times the position, over
// the pair's factor): cos and sin of the angle blended between scaled and kept, times the magnitude.
std::pair<double, double> rope_yarn(double theta_extrap, std::size_t i, const ops::RopeShape& s,
                                    std::array<float, 2> corr) {
  const double theta_interp = s.freq_scale * theta_extrap;
  double theta = theta_interp, mscale = s.yarn.attn_factor;
  if (s.yarn.ext_factor != 0.0f) {
    const double y = (static_cast<double>(i) - corr[0]) / std::max(0.001, double{corr[1]} - corr[0]);
    const double ramp_mix = (1.0 - std::min(1.0, std::max(0.0, y))) * s.yarn.ext_factor;
    theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
    mscale *= 1.0 + 0.1 * std::log(1.0 / s.freq_scale);
  }
  return {std::cos(theta) * mscale, std::sin(theta) * mscale};
}
}  // namespace

Vec rope(const Vec& x, const std::vector<std::int32_t>& positions, const ops::RopeShape& s) {
  std::size_t dims = s.rotary_dims == 0 ? s.head_dim : s.rotary_dims;
  const auto corr = ops::rope_yarn_correction(s);
  Vec out = x;
  for (std::size_t t = 0; t < s.tokens; ++t) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      std::size_t base = (t * s.heads + h) * s.head_dim;
      for (std::size_t i = 0; i < dims / 2; ++i) {
        const double factor = s.freq_factors.empty() ? 1.0 : s.freq_factors[i];
        const double theta = positions[t] * std::pow(double(s.freq_base), -2.0 * i / dims) / factor;
        const auto [c, sn] = rope_yarn(theta, i, s, corr);
        std::size_t i0 = s.neox ? i : 2 * i, i1 = s.neox ? i + dims / 2 : 2 * i + 1;
        double x0 = x[base + i0], x1 = x[base + i1];
        out[base + i0] = static_cast<float>(x0 * c - x1 * sn);
        out[base + i1] = static_cast<float>(x0 * sn + x1 * c);
      }
    }
  }
  return out;
}

Vec matmul(const Vec& weights, const Vec& acts, std::size_t m, std::size_t k, std::size_t n) {
  Vec out(n * m);
  for (std::size_t c = 0; c < n; ++c) {
    for (std::size_t r = 0; r < m; ++r) {
      double s = 0;
      for (std::size_t i = 0; i < k; ++i) s += double(weights[r * k + i]) * acts[c * k + i];
      out[c * m + r] = static_cast<float>(s);
    }
  }
  return out;
}

Vec int8_blocks(const Vec& acts) {
  Vec out(acts.size());
  for (std::size_t b = 0; b + 32 <= acts.size(); b += 32) {
    float amax = 0;
    for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(acts[i]));
    const float inv = amax > 0 ? 1.0f / amax : 0.0f;
    for (std::size_t i = b; i < b + 32; ++i) out[i] = std::round(std::clamp(acts[i] * inv, -1.0f, 1.0f) * 127.0f) * (amax / 127.0f);
  }
  return out;
}

Vec attention(const Vec& q, const LogicalCache& cache, const std::vector<std::uint32_t>& seq,
              const std::vector<std::uint32_t>& pos, const ops::AttentionShape& s) {
  std::size_t d = s.head_dim, group = s.heads / s.kv_heads;
  Vec out(s.tokens * s.heads * d);
  for (std::size_t t = 0; t < s.tokens; ++t) {
    const auto& keys = cache.keys[seq[t]];
    const auto& values = cache.values[seq[t]];
    for (std::size_t h = 0; h < s.heads; ++h) {
      std::size_t kvh = h / group;
      const float* qh = &q[(t * s.heads + h) * d];
      // Keys first .. pos[t]: all of them, or the window's.
      const std::size_t first = s.window != 0 && pos[t] + 1 > s.window ? pos[t] + 1 - s.window : 0;
      std::vector<double> scores(pos[t] + 1 - first);
      for (std::size_t j = first; j <= pos[t]; ++j) {
        double dot = 0;
        for (std::size_t i = 0; i < d; ++i) dot += double(qh[i]) * keys[j][kvh * d + i];
        scores[j - first] = dot * s.scale;
        if (s.softcap != 0) scores[j - first] = s.softcap * std::tanh(scores[j - first] / s.softcap);
      }
      double m = *std::max_element(scores.begin(), scores.end()), sum = 0;
      for (auto& sc : scores) sum += (sc = std::exp(sc - m));
      for (std::size_t i = 0; i < d; ++i) {
        double o = 0;
        for (std::size_t j = first; j <= pos[t]; ++j) o += scores[j - first] * values[j][kvh * d + i];
        out[(t * s.heads + h) * d + i] = static_cast<float>(o / sum);
      }
    }
  }
  return out;
}

std::vector<std::uint32_t> argmax(const Vec& x, std::size_t rows, std::size_t n) {
  std::vector<std::uint32_t> out(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    auto first = x.begin() + static_cast<std::ptrdiff_t>(r * n);
    out[r] = static_cast<std::uint32_t>(std::max_element(first, first + static_cast<std::ptrdiff_t>(n)) - first);
  }
  return out;
}

void topk(const Vec& x, std::size_t rows, std::size_t n, std::size_t k, Vec& values, std::vector<std::uint32_t>& indices) {
  values.clear();
  indices.clear();
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<std::uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    const float* row = &x[r * n];
    std::stable_sort(order.begin(), order.end(), [row](std::uint32_t a, std::uint32_t b) { return row[a] > row[b]; });
    for (std::size_t i = 0; i < k; ++i) {
      values.push_back(row[order[i]]);
      indices.push_back(order[i]);
    }
  }
}

void moe_route(const Vec& logits, std::size_t rows, std::size_t n, std::size_t k, Vec& weights,
               std::vector<std::uint32_t>& experts) {
  // The softmax's denominator cancels in the renormalisation: the top k logits' exponentials.
  Vec top;
  topk(logits, rows, n, k, top, experts);
  weights.assign(rows * k, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (std::size_t j = 0; j < k; ++j) sum += std::exp(double{top[r * k + j]} - top[r * k]);
    for (std::size_t j = 0; j < k; ++j) weights[r * k + j] = static_cast<float>(std::exp(double{top[r * k + j]} - top[r * k]) / sum);
  }
}

namespace {

double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The dim values from offset, divided by sqrt(sum x^2 + eps) (llama.cpp's L2 norm of a head).
std::vector<double> l2_normed(const Vec& rows, std::size_t offset, std::size_t dim, float eps) {
  double sum = 0;
  for (std::size_t i = 0; i < dim; ++i) sum += double{rows[offset + i]} * rows[offset + i];
  const double scale = 1.0 / std::sqrt(sum + eps);
  std::vector<double> out(dim);
  for (std::size_t i = 0; i < dim; ++i) out[i] = rows[offset + i] * scale;
  return out;
}

// One token through one value head: S (dim value rows r, dim key columns c; element (r, c) at
// c * dim + r, so that the GPU's threads, one per row, read consecutive words) decayed and updated;
// S q / sqrt(dim) into o.
void delta_step(float* S, const std::vector<double>& q, const std::vector<double>& k, const float* v, double decay,
                double beta, float* o) {
  const std::size_t dim = q.size();
  for (std::size_t i = 0; i < dim * dim; ++i) S[i] = static_cast<float>(S[i] * decay);
  for (std::size_t r = 0; r < dim; ++r) {
    double sk = 0;
    for (std::size_t c = 0; c < dim; ++c) sk += S[c * dim + r] * k[c];
    const double d = beta * (v[r] - sk);
    double out = 0;
    for (std::size_t c = 0; c < dim; ++c) {
      S[c * dim + r] = static_cast<float>(S[c * dim + r] + d * k[c]);
      out += S[c * dim + r] * q[c];
    }
    o[r] = static_cast<float>(out / std::sqrt(static_cast<double>(dim)));
  }
}

}  // namespace

Vec short_conv(const Vec& x, const Vec& taps, Vec& state, const ops::DeltaNetShape& s) {
  const std::size_t channels = s.conv_dim(), kernel = s.conv_kernel, tokens = s.tokens;
  Vec window(state);  // (kernel - 1 + tokens, channels)
  window.insert(window.end(), x.begin(), x.end());
  Vec out(tokens * channels);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t c = 0; c < channels; ++c) {
      double sum = 0;
      for (std::size_t i = 0; i < kernel; ++i) sum += double{window[(t + i) * channels + c]} * taps[c * kernel + i];
      out[t * channels + c] = static_cast<float>(sum * sigmoid(sum));
    }
  }
  state.assign(window.end() - static_cast<std::ptrdiff_t>((kernel - 1) * channels), window.end());
  return out;
}

Vec delta_rule(const Vec& qkv, const Vec& alpha, const Vec& beta, const Vec& dt_bias, const Vec& rate, Vec& state,
               const ops::DeltaNetShape& s) {
  const std::size_t dim = s.head_dim, heads = s.v_heads, key = s.key_dim(), channels = s.conv_dim();
  Vec out(std::size_t{s.tokens} * s.value_dim());
  for (std::size_t t = 0; t < s.tokens; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t kh = h % s.k_heads, row = t * channels;
      const double decay = std::exp(softplus(double{alpha[t * heads + h]} + dt_bias[h]) * rate[h]);
      delta_step(state.data() + h * dim * dim, l2_normed(qkv, row + kh * dim, dim, s.eps),
                 l2_normed(qkv, row + key + kh * dim, dim, s.eps), qkv.data() + row + 2 * key + h * dim, decay,
                 sigmoid(beta[t * heads + h]), out.data() + (t * heads + h) * dim);
    }
  }
  return out;
}

}  // namespace mqlm::gpu::reference
