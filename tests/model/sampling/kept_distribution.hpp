// What the sampler tests fit draws against: the exact kept-set distribution docs/sampling.md
// defines, Pearson's chi-square statistic and its critical value. Shared by the CPU sampler's
// tests and the GPU sampler's (tests/model/llama/gpu_sampler_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "model/sampling/sampling_params.hpp"

namespace mqlm::model::testing {

// The exact distribution the spec defines, computed here in double from a full sort: the
// reference the sampler's partial sorts and float weights must reproduce.
inline std::vector<double> kept_distribution(const std::vector<float>& logits, const SamplingParams& c) {
  std::vector<float> sorted(logits);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  double max = sorted[0];
  auto weight = [&](double l) { return std::exp((l - max) / c.temperature); };
  double threshold = -std::numeric_limits<double>::infinity();
  if (c.top_k > 0 && static_cast<std::size_t>(c.top_k) < sorted.size()) threshold = sorted[c.top_k - 1];
  if (c.top_p < 1.0f) {
    double total = 0.0, mass = 0.0;
    for (float l : sorted) total += l >= threshold ? weight(l) : 0.0;
    for (float l : sorted) {
      if ((mass += weight(l)) >= c.top_p * total) {
        threshold = std::max(threshold, double{l});
        break;
      }
    }
  }
  if (c.min_p > 0.0f) threshold = std::max(threshold, max + c.temperature * std::log(double{c.min_p}));
  std::vector<double> p(logits.size());
  double z = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) z += p[i] = logits[i] >= threshold ? weight(logits[i]) : 0.0;
  for (auto& v : p) v /= z;
  return p;
}

// Pearson's statistic over bins of expected count >= 5 (the rest pooled); infinite when a token
// expected never to come came. Returns {statistic, degrees of freedom}.
inline std::pair<double, int> chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double statistic = 0.0, pooled_expected = 0.0;
  int pooled_count = 0, bins = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    double expected = p[i] * n;
    if (expected == 0.0 && counts[i] > 0) return {std::numeric_limits<double>::infinity(), 1};
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_count += counts[i];
      continue;
    }
    statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++bins;
  }
  if (pooled_expected >= 5.0) {
    statistic += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / pooled_expected;
    ++bins;
  }
  return {statistic, bins - 1};
}

// The chi-square quantile at significance 1e-4 (Wilson-Hilferty, z = 3.719): with fixed seeds
// the test is deterministic, and a correct sampler clears it with room whatever the seeds.
inline double critical_value(int degrees_of_freedom) {
  double k = degrees_of_freedom, h = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - h + 3.719 * std::sqrt(h), 3.0);
}

}  // namespace mqlm::model::testing
