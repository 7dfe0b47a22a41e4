#include "model/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "model/sampling/philox.hpp"

namespace mqlm::model {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// p is a float (0.9f is 0.9000000238...): a nucleus whose mass is within this relative distance
// of p counts as reaching it, so that the set a user means by "p = 0.8" is the one kept.
constexpr double kTopPTolerance = 1e-6;

// Up to this k, top-k selects with a heap rather than nth_element over a copy of the vocabulary.
constexpr std::size_t kSmallTopK = 1024;

float sanitised(float logit) {
  if (std::isnan(logit)) return kNegativeInfinity;
  if (logit == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return logit;
}

// expf((logit - max) * (1 / temperature)) in float, as the GPU computes it: the draw's weights,
// relative to the most likely. Sums of them are double here.
float relative_weight(float logit, float max, float inverse_temperature) {
  return std::exp((logit - max) * inverse_temperature);
}

bool allowed(std::span<const std::uint32_t> allowed_bits, std::size_t token) {
  return allowed_bits.empty() || ((allowed_bits[token / 32] >> (token % 32)) & 1u) != 0;
}

// Computed once in float, as the host hands it to the GPU.
float min_p_offset_of(const SamplingParams& params) {
  return params.min_p > 0.0f ? params.temperature * std::log(params.min_p) : kNegativeInfinity;
}

}  // namespace

Sampler::Sampler(SamplingParams params, std::span<const std::int32_t> prompt)
    : params_(std::move(params)), min_p_offset_(min_p_offset_of(params_)) {
  if (auto problem = validate(params_))
    throw std::invalid_argument("Sampler: invalid sampling parameters: " + problem->message);
  for (const TokenBias& entry : params_.logit_bias) bias_[entry.token] = entry.bias;
  auto n = std::min<std::size_t>(prompt.size(), repetition_window());
  for (std::int32_t token : prompt.subspan(prompt.size() - n)) {
    recent_.push_back(token);
    ++recent_counts_[token];
  }
}

SampledToken Sampler::sample(std::span<const float> logits, std::span<const std::uint32_t> allowed_bits) {
  float max = adjust(logits, allowed_bits);
  SampledToken result;
  double log_normaliser = params_.logprobs ? report_top_logprobs(result, max) : 0.0;
  result.token = params_.temperature == 0.0f ? argmax(max) : draw(max);
  if (params_.logprobs) result.logprob = static_cast<float>(adjusted_[result.token] - log_normaliser);
  record(result.token);
  return result;
}

float Sampler::adjust(std::span<const float> logits, std::span<const std::uint32_t> allowed_bits) {
  if (!allowed_bits.empty() && allowed_bits.size() < (logits.size() + 31) / 32)
    throw std::invalid_argument("Sampler: the allowed-token mask has " + std::to_string(allowed_bits.size()) +
                                " words for " + std::to_string(logits.size()) + " logits");
  adjusted_.resize(logits.size());
  // The mask test stays out of the common loop, which the compiler can then vectorise.
  std::transform(logits.begin(), logits.end(), adjusted_.begin(), sanitised);
  if (!allowed_bits.empty()) {
    for (std::size_t i = 0; i < logits.size(); ++i)
      if (!allowed(allowed_bits, i)) adjusted_[i] = kNegativeInfinity;
  }
  auto in_range = [&](std::int32_t id) { return id >= 0 && static_cast<std::size_t>(id) < adjusted_.size(); };
  for (const auto& [id, bias] : bias_)
    if (in_range(id)) adjusted_[id] += bias;
  for (const auto& [id, count] : recent_counts_)
    if (in_range(id)) adjusted_[id] = penalised(id, adjusted_[id]);
  for (const auto& [id, count] : output_counts_)
    if (in_range(id) && !recent_counts_.contains(id)) adjusted_[id] = penalised(id, adjusted_[id]);
  float max = adjusted_.empty() ? kNegativeInfinity : *std::max_element(adjusted_.begin(), adjusted_.end());
  if (max == kNegativeInfinity)
    throw std::invalid_argument("Sampler: no allowed logit is finite (all NaN, -inf or masked)");
  return max;
}

float Sampler::penalised(std::int32_t id, float logit) const {
  if (recent_counts_.contains(id)) {
    float r = params_.repetition_penalty;
    logit = logit > 0.0f ? logit * (1.0f / r) : logit * r;  // a product on both sides, as the GPU rounds it
  }
  if (auto it = output_counts_.find(id); it != output_counts_.end())
    logit -= static_cast<float>(it->second) * params_.frequency_penalty + params_.presence_penalty;
  return logit;
}

// Fills result.top_logprobs; returns the log-normaliser, a log-sum-exp in double.
double Sampler::report_top_logprobs(SampledToken& result, float max) const {
  double sum = 0.0;
  for (float l : adjusted_) sum += std::exp(double{l} - max);
  double log_normaliser = max + std::log(sum);
  auto more_likely = [&](std::int32_t a, std::int32_t b) {
    return adjusted_[a] > adjusted_[b] || (adjusted_[a] == adjusted_[b] && a < b);
  };
  // A bounded selection, not a sort of the vocabulary: top_logprobs is at most 20.
  std::vector<std::int32_t> top;
  auto count = std::min<std::size_t>(params_.top_logprobs, adjusted_.size());
  for (std::size_t i = 0; i < adjusted_.size() && count > 0; ++i) {
    auto id = static_cast<std::int32_t>(i);
    if (top.size() == count && !more_likely(id, top.front())) continue;
    if (top.size() == count) {
      std::pop_heap(top.begin(), top.end(), more_likely);
      top.pop_back();
    }
    top.push_back(id);
    std::push_heap(top.begin(), top.end(), more_likely);
  }
  std::sort_heap(top.begin(), top.end(), more_likely);
  for (std::int32_t id : top)
    result.top_logprobs.push_back({id, static_cast<float>(adjusted_[id] - log_normaliser)});
  return log_normaliser;
}

// The first of equal maxima: ties go to the lowest id.
std::int32_t Sampler::argmax(float max) const {
  return static_cast<std::int32_t>(std::find(adjusted_.begin(), adjusted_.end(), max) - adjusted_.begin());
}

// t_k: the k-th largest value counting multiplicity; -inf when top-k is off.
float Sampler::top_k_threshold() {
  auto k = static_cast<std::size_t>(params_.top_k);
  if (k == 0 || k >= adjusted_.size()) return kNegativeInfinity;
  // A small k (the usual 40): one pass with a k-sized heap, most values rejected at a compare.
  if (k <= kSmallTopK) {
    scratch_.resize(k);
    std::partial_sort_copy(adjusted_.begin(), adjusted_.end(), scratch_.begin(), scratch_.end(), std::greater<>());
    return scratch_[k - 1];
  }
  scratch_.assign(adjusted_.begin(), adjusted_.end());
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch_.end(),
                   std::greater<>());
  return scratch_[k - 1];
}

// t_p: walking the values at or above t_k from the largest, the value where the mass first
// reaches p of theirs. Sorts only as far as the nucleus reaches, not the vocabulary.
float Sampler::top_p_threshold(float top_k_threshold, float max, float inverse_temperature) {
  if (params_.top_p >= 1.0f) return kNegativeInfinity;
  scratch_.clear();
  double total = 0.0;
  for (float l : adjusted_) {
    if (l < top_k_threshold) continue;
    scratch_.push_back(l);
    total += relative_weight(l, max, inverse_temperature);
  }
  double target = double{params_.top_p} * total * (1.0 - kTopPTolerance);
  double mass = 0.0;
  std::size_t sorted = 0;
  for (std::size_t chunk = std::min<std::size_t>(64, scratch_.size());; chunk = std::min(chunk * 4, scratch_.size())) {
    auto from = scratch_.begin() + static_cast<std::ptrdiff_t>(sorted);
    auto to = scratch_.begin() + static_cast<std::ptrdiff_t>(chunk);
    std::nth_element(from, to - 1, scratch_.end(), std::greater<>());
    std::sort(from, to, std::greater<>());
    for (; sorted < chunk; ++sorted) {
      mass += relative_weight(scratch_[sorted], max, inverse_temperature);
      if (mass >= target) return scratch_[sorted];
    }
    if (chunk == scratch_.size()) return kNegativeInfinity;  // rounding: the whole set is kept
  }
}

// The kept set is every token at or above the highest threshold; the draw walks it in id order.
std::int32_t Sampler::draw(float max) {
  float inverse_temperature = 1.0f / params_.temperature;
  float top_k = top_k_threshold();
  float kept_from = std::max({top_k, top_p_threshold(top_k, max, inverse_temperature), max + min_p_offset_});
  kept_.clear();
  weights_.clear();
  double total = 0.0;
  for (std::size_t i = 0; i < adjusted_.size(); ++i) {
    if (adjusted_[i] < kept_from) continue;
    kept_.push_back(static_cast<std::int32_t>(i));
    weights_.push_back(relative_weight(adjusted_[i], max, inverse_temperature));
    total += weights_.back();
  }
  double target = double{uniform_for(params_.seed, static_cast<std::uint32_t>(generated_count_))} * total;
  double mass = 0.0;
  std::int32_t last_possible = kept_.front();
  for (std::size_t i = 0; i < kept_.size(); ++i) {
    if (weights_[i] <= 0.0f) continue;
    mass += weights_[i];
    last_possible = kept_[i];
    if (mass > target) return last_possible;
  }
  return last_possible;  // the rounding of the running sum left target just above the end
}

// With one token pending on the GPU, the GPU adds it to the window itself: the host describes
// the last repetition_last_n - 1 known tokens (the history, then `then`).
std::vector<std::int32_t> Sampler::window_tokens(bool one_pending, std::span<const std::int32_t> then) const {
  std::size_t size = repetition_window();
  if (one_pending && size > 0) --size;
  std::vector<std::int32_t> known(recent_.begin(), recent_.end());
  known.insert(known.end(), then.begin(), then.end());
  size = std::min(size, known.size());
  known.erase(known.begin(), known.end() - static_cast<std::ptrdiff_t>(size));
  return known;
}

SamplingRow Sampler::gpu_row(bool one_pending) const { return row_after(one_pending, {}); }

SamplingRow Sampler::gpu_row_after(std::span<const std::int32_t> drafts) const { return row_after(false, drafts); }

SamplingRow Sampler::row_after(bool one_pending, std::span<const std::int32_t> then) const {
  SamplingRow row{.temperature = params_.temperature,
                  .top_k = params_.top_k,
                  .top_p = params_.top_p,
                  .min_p_offset = min_p_offset_,
                  .repetition_penalty = repetition_window() > 0 ? params_.repetition_penalty : 1.0f,
                  .presence_penalty = params_.presence_penalty,
                  .frequency_penalty = params_.frequency_penalty,
                  .seed = params_.seed,
                  .top_logprobs = params_.top_logprobs,
                  .logprobs = params_.logprobs,
                  .counter = static_cast<std::uint32_t>(generated_count_ + (one_pending ? 1 : 0) +
                                                        static_cast<std::int64_t>(then.size())),
                  .entries = {}};
  std::map<std::int32_t, SamplingEntry> entries;  // ordered: the row lists tokens ascending
  auto entry = [&](std::int32_t token) -> SamplingEntry& {
    auto [it, inserted] = entries.try_emplace(token, SamplingEntry{.token = token});
    return it->second;
  };
  for (const auto& [token, bias] : bias_) entry(token).bias = bias;
  for (std::int32_t token : window_tokens(one_pending, then)) entry(token).in_window = 1;
  // Counts only where a penalty reads them: a row with no entries skips the GPU's penalty pass.
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [token, count] : output_counts_) entry(token).count = static_cast<std::uint32_t>(count);
    for (std::int32_t token : then) ++entry(token).count;
  }
  for (const auto& [token, e] : entries) row.entries.push_back(e);
  return row;
}

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
