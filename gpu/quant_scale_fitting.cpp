// The scale choice every quantizer shares: for each of a few candidate ranges, round to the levels,
// then refit the scale (and offset) by least squares to those levels, and keep the candidate with
// the least squared error. Cheap (a dozen passes over 16-32 values) and within a few percent of
// llama.cpp's iterative searches on normal data.
#include <algorithm>
#include <cmath>
#include <limits>

#include "gpu/weight_format_blocks.hpp"

namespace mqlm::gpu::blocks {
namespace {

// Round to nearest even for |v| < 2^22 without a call into libm (std::nearbyint is one): adding
// 1.5 * 2^23 leaves no fraction bits. The quantizers spend most of their time here.
float round_small(float v) {
  constexpr float shift = 12582912.0f;
  return (v + shift) - shift;
}

float largest_magnitude(std::span<const float> x) {
  float extreme = 0;
  for (float v : x) {
    if (std::fabs(v) > std::fabs(extreme)) extreme = v;
  }
  return extreme;
}

// For levels q fixed, the error of the best scale s = sum(x q) / sum(q q) is
// sum(x x) - sum(x q)^2 / sum(q q): the candidate with the largest gain has the least error.
struct ScaleRefit {
  double xq = 0, qq = 0;
  double gain() const { return qq > 0 ? xq * xq / qq : 0; }
  float scale() const { return qq > 0 ? static_cast<float>(xq / qq) : 0.0f; }
};

// The scale, over candidates that put the largest-magnitude element on level `divisor`, whose
// least-squares refit to the levels chosen (level_of(x / scale)) leaves the least error.
template <class LevelOf>
float best_refit_scale(std::span<const float> x, std::span<const float> divisors, LevelOf level_of) {
  float extreme = largest_magnitude(x);
  if (extreme == 0) return 0;
  ScaleRefit best;
  for (float divisor : divisors) {
    float inverse = divisor / extreme;
    ScaleRefit refit;
    for (float v : x) {
      double q = level_of(v * inverse);
      refit.xq += double(v) * q;
      refit.qq += q * q;
    }
    if (refit.gain() > best.gain()) best = refit;
  }
  return best.qq > 0 ? best.scale() : extreme / divisors[0];
}

// The least-squares (scale, offset) for fixed levels q: with the offset held at 0 where the
// unconstrained optimum breaks offset_at_most_zero.
AffineFit refit_affine(std::span<const float> x, std::span<const int> q, bool offset_at_most_zero) {
  double n = static_cast<double>(x.size()), sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sq += q[i];
    sqq += double(q[i]) * q[i];
    sx += x[i];
    sqx += double(q[i]) * x[i];
  }
  double det = n * sqq - sq * sq;
  if (det <= 0) return {0.0f, static_cast<float>(sx / n)};
  double scale = (n * sqx - sq * sx) / det, offset = (sqq * sx - sq * sqx) / det;
  if (offset_at_most_zero && offset > 0) {
    offset = 0;
    scale = sqx / sqq;
  }
  return {static_cast<float>(std::max(scale, 0.0)), static_cast<float>(offset)};
}

double affine_error(std::span<const float> x, std::span<const int> q, AffineFit fit) {
  double error = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double e = double(fit.scale) * q[i] + fit.offset - x[i];
    error += e * e;
  }
  return error;
}

}  // namespace

int round_to_level(float value, float scale, int qmin, int qmax) {
  float level = scale == 0 ? 0.0f : value / scale;
  return static_cast<int>(round_small(std::clamp(level, static_cast<float>(qmin), static_cast<float>(qmax))));
}

float fit_symmetric_scale(std::span<const float> x, int qmin, int qmax) {
  float divisors[18];
  for (int k = 0; k < 13; ++k) divisors[k] = static_cast<float>(qmin) + 0.25f * static_cast<float>(k - 8);
  for (int k = 0; k < 5; ++k) divisors[13 + k] = static_cast<float>(qmax) + 0.25f * static_cast<float>(k);
  return best_refit_scale(x, divisors, [&](float level) {
    return round_small(std::clamp(level, static_cast<float>(qmin), static_cast<float>(qmax)));
  });
}

AffineFit fit_affine(std::span<const float> x, int qmax, bool offset_at_most_zero) {
  auto [lo_it, hi_it] = std::minmax_element(x.begin(), x.end());
  float lo = offset_at_most_zero ? std::min(*lo_it, 0.0f) : *lo_it, hi = *hi_it;
  if (!(hi > lo)) return {0.0f, lo};
  int q[32];
  std::span<int> levels(q, x.size());
  AffineFit best{(hi - lo) / static_cast<float>(qmax), lo};
  double best_error = std::numeric_limits<double>::infinity();
  for (int k = -1; k <= 6; ++k) {  // ranges shrunk about their middle, clipping both tails alike
    float scale = (hi - lo) / (static_cast<float>(qmax) + 0.5f * static_cast<float>(k));
    float offset = 0.5f * (lo + hi) - 0.5f * scale * static_cast<float>(qmax);
    for (std::size_t i = 0; i < x.size(); ++i) levels[i] = round_to_level(x[i] - offset, scale, 0, qmax);
    AffineFit fit = refit_affine(x, levels, offset_at_most_zero);
    double error = affine_error(x, levels, fit);
    if (error < best_error) {
      best_error = error;
      best = fit;
    }
  }
  return best;
}

int nearest_iq4_level(float value) {
  static constexpr float midpoints[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                          7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
  int index = 0;
  for (float midpoint : midpoints) index += midpoint <= value ? 1 : 0;  // branch-free: levels are random
  return index;
}

float fit_iq4_scale(std::span<const float> x) {
  float divisors[18];
  for (int k = 0; k < 11; ++k) divisors[k] = -127.0f + 4.0f * static_cast<float>(k - 6);
  for (int k = 0; k < 7; ++k) divisors[11 + k] = 113.0f + 4.0f * static_cast<float>(k - 2);
  return best_refit_scale(x, divisors, [](float level) { return float(kIq4Levels[nearest_iq4_level(level)]); });
}

}  // namespace mqlm::gpu::blocks
