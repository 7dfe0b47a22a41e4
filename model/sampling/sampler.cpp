#include "model/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace mqlm::model {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// p is a float (0.9f is 0.9000000238...): a nucleus whose mass is within this relative distance
// of p counts as reaching it, so that the set a user means by "p = 0.8" is the one kept.
constexpr double kTopPTolerance = 1e-6;

float sanitised(float logit) {
  if (std::isnan(logit)) return kNegativeInfinity;
  if (logit == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return logit;
}

// exp((logit - max) / temperature) in float: the draw's weights, relative to the most likely.
// float exp is several times faster than double over a whole vocabulary; sums stay in double.
float relative_weight(float logit, float max, float inverse_temperature) {
  return std::exp((logit - max) * inverse_temperature);
}

// The canonical order: by logit, ties to the lowest id. A function object, so sorts inline it.
constexpr struct {
  template <typename Candidate>
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
} more_likely;

template <typename Candidate>
double log_sum_exp(const std::vector<Candidate>& candidates) {
  float max = kNegativeInfinity;
  for (const auto& c : candidates) max = std::max(max, c.logit);
  double sum = 0.0;
  for (const auto& c : candidates) sum += std::exp(double{c.logit} - max);
  return max + std::log(sum);
}

}  // namespace

Sampler::Sampler(SamplingParams params, std::span<const std::int32_t> prompt)
    : params_(std::move(params)), rng_(params_.seed) {
  if (auto problem = validate(params_))
    throw std::invalid_argument("Sampler: invalid sampling parameters: " + problem->message);
  auto n = std::min<std::size_t>(prompt.size(), repetition_window());
  for (std::int32_t token : prompt.subspan(prompt.size() - n)) {
    recent_.push_back(token);
    ++recent_counts_[token];
  }
}

SampledToken Sampler::sample(std::span<const float> logits) {
  load_full(logits);
  return finish(std::nullopt);
}

SampledToken Sampler::sample(const CandidateLogits& candidates) {
  return finish(load_candidates(candidates));
}

void Sampler::load_full(std::span<const float> logits) {
  work_.resize(logits.size());
  bool any_finite = false;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    work_[i] = {static_cast<std::int32_t>(i), sanitised(logits[i])};
    any_finite = any_finite || work_[i].logit != kNegativeInfinity;
  }
  if (!any_finite) throw std::invalid_argument("Sampler: no logit is finite (all NaN or -inf)");
  auto in_range = [&](std::int32_t id) { return id >= 0 && static_cast<std::size_t>(id) < work_.size(); };
  for (const auto& [id, count] : recent_counts_)
    if (in_range(id)) work_[id].logit = penalised(id, work_[id].logit);
  for (const auto& [id, count] : output_counts_)
    if (in_range(id) && !recent_counts_.contains(id)) work_[id].logit = penalised(id, work_[id].logit);
}

std::optional<double> Sampler::load_candidates(const CandidateLogits& candidates) {
  if (candidates.ids.size() != candidates.logits.size() || candidates.ids.empty())
    throw std::invalid_argument("Sampler: candidate ids and logits must be non-empty and of one size");
  work_.resize(candidates.ids.size());
  for (std::size_t i = 0; i < work_.size(); ++i)
    work_[i] = {candidates.ids[i], sanitised(candidates.logits[i])};
  std::sort(work_.begin(), work_.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  bool any_finite = false;
  // The full vocabulary's normaliser moves by what the penalties change in the candidates.
  double change = 0.0;
  double lse = candidates.log_sum_exp.value_or(0.0);
  for (std::size_t i = 0; i < work_.size(); ++i) {
    if (i > 0 && work_[i].id == work_[i - 1].id)
      throw std::invalid_argument("Sampler: candidate id " + std::to_string(work_[i].id) + " appears twice");
    float raw = work_[i].logit;
    work_[i].logit = penalised(work_[i].id, raw);
    if (candidates.log_sum_exp && work_[i].logit != raw)
      change += std::exp(double{work_[i].logit} - lse) - std::exp(double{raw} - lse);
    any_finite = any_finite || work_[i].logit != kNegativeInfinity;
  }
  if (!any_finite) throw std::invalid_argument("Sampler: no candidate logit is finite (all NaN or -inf)");
  if (!candidates.log_sum_exp) return std::nullopt;
  // Rounding can take 1 + change to 0 or below; finish() then falls back to the candidates' own.
  return 1.0 + change > 0.0 ? lse + std::log1p(change) : kNegativeInfinity;
}

float Sampler::penalised(std::int32_t id, float logit) const {
  if (recent_counts_.contains(id)) {
    float r = params_.repetition_penalty;
    logit = logit > 0.0f ? logit / r : logit * r;
  }
  if (auto it = output_counts_.find(id); it != output_counts_.end())
    logit -= static_cast<float>(it->second) * params_.frequency_penalty + params_.presence_penalty;
  return logit;
}

SampledToken Sampler::finish(std::optional<double> given_log_normaliser) {
  SampledToken result;
  double log_normaliser = 0.0;
  if (params_.logprobs) {
    // The normaliser can never be below the candidates' own (a GPU sum slightly off, rounding).
    log_normaliser = std::max(given_log_normaliser.value_or(kNegativeInfinity), log_sum_exp(work_));
    std::vector<Candidate> top(std::min<std::size_t>(params_.top_logprobs, work_.size()));
    std::partial_sort_copy(work_.begin(), work_.end(), top.begin(), top.end(), more_likely);
    for (const Candidate& c : top)
      result.top_logprobs.push_back({c.id, static_cast<float>(c.logit - log_normaliser)});
  }
  std::int32_t index = choose();
  result.token = work_[index].id;
  if (params_.logprobs) result.logprob = static_cast<float>(work_[index].logit - log_normaliser);
  record(result.token);
  return result;
}

std::int32_t Sampler::choose() {
  if (params_.temperature == 0.0f) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < work_.size(); ++i)
      if (more_likely(work_[i], work_[best])) best = i;
    return static_cast<std::int32_t>(best);
  }
  keep_top_k();
  keep_top_p();
  keep_min_p();
  return draw();
}

void Sampler::keep_top_k() {
  auto k = static_cast<std::size_t>(params_.top_k);
  if (k == 0 || k >= work_.size()) return;
  std::partial_sort(work_.begin(), work_.begin() + static_cast<std::ptrdiff_t>(k), work_.end(),
                    more_likely);
  work_.resize(k);
}

// Sorts only as far as the nucleus reaches: a few hundred candidates, not the vocabulary.
void Sampler::keep_top_p() {
  if (params_.top_p >= 1.0f) return;
  float max = kNegativeInfinity;
  for (const auto& c : work_) max = std::max(max, c.logit);
  float inverse_temperature = 1.0f / params_.temperature;
  auto weight = [&](const Candidate& c) { return double{relative_weight(c.logit, max, inverse_temperature)}; };
  double total = 0.0;
  for (const auto& c : work_) total += weight(c);
  double target = params_.top_p * total * (1.0 - kTopPTolerance);
  double mass = 0.0;
  std::size_t sorted = 0;
  for (std::size_t chunk = std::min<std::size_t>(64, work_.size());; chunk = std::min(chunk * 4, work_.size())) {
    auto from = work_.begin() + static_cast<std::ptrdiff_t>(sorted);
    auto to = work_.begin() + static_cast<std::ptrdiff_t>(chunk);
    std::nth_element(from, to - 1, work_.end(), more_likely);
    std::sort(from, to, more_likely);
    for (; sorted < chunk; ++sorted) {
      mass += weight(work_[sorted]);
      if (mass >= target) {
        work_.resize(sorted + 1);
        return;
      }
    }
    if (chunk == work_.size()) return;
  }
}

void Sampler::keep_min_p() {
  if (params_.min_p <= 0.0f) return;
  float max = kNegativeInfinity;
  for (const auto& c : work_) max = std::max(max, c.logit);
  // p / p_max >= min_p  <=>  (logit - max) / temperature >= log(min_p)
  double threshold = max + double{params_.temperature} * std::log(double{params_.min_p});
  std::erase_if(work_, [&](const Candidate& c) { return c.logit < threshold && c.logit != max; });
}

std::int32_t Sampler::draw() {
  float max = kNegativeInfinity;
  for (const auto& c : work_) max = std::max(max, c.logit);
  float inverse_temperature = 1.0f / params_.temperature;
  double total = 0.0;
  for (const auto& c : work_) total += relative_weight(c.logit, max, inverse_temperature);
  double target = uniform01() * total;
  double mass = 0.0;
  std::int32_t last_possible = 0;
  for (std::size_t i = 0; i < work_.size(); ++i) {
    double w = relative_weight(work_[i].logit, max, inverse_temperature);
    if (w <= 0.0) continue;
    mass += w;
    last_possible = static_cast<std::int32_t>(i);
    if (mass > target) return last_possible;
  }
  return last_possible;  // the rounding of the running sum left target just above the end
}

double Sampler::uniform01() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

// No window to track when the penalty is off.
std::size_t Sampler::repetition_window() const {
  return params_.repetition_penalty == 1.0f ? 0 : static_cast<std::size_t>(params_.repetition_last_n);
}

void Sampler::record(std::int32_t token) {
  ++generated_count_;
  ++output_counts_[token];
  if (repetition_window() == 0) return;
  recent_.push_back(token);
  ++recent_counts_[token];
  if (recent_.size() > repetition_window()) {
    std::int32_t oldest = recent_.front();
    recent_.pop_front();
    if (--recent_counts_[oldest] == 0) recent_counts_.erase(oldest);
  }
}

}  // namespace mqlm::model
