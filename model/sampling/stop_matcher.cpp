#include "model/sampling/stop_matcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace mqlm::model {

StopMatcher::StopMatcher(std::vector<std::string> stop_strings,
                         std::vector<std::int32_t> stop_tokens, std::int32_t max_tokens)
    : stop_strings_(std::move(stop_strings)), stop_tokens_(std::move(stop_tokens)),
      max_tokens_(max_tokens) {
  if (max_tokens_ < 1) throw std::invalid_argument("StopMatcher: max_tokens must be at least 1");
  for (const auto& stop : stop_strings_)
    if (stop.empty()) throw std::invalid_argument("StopMatcher: a stop string is empty");
}

StopMatcher StopMatcher::for_request(const SamplingParams& params,
                                     std::span<const std::int32_t> model_stop_tokens) {
  std::vector<std::int32_t> tokens = params.stop_token_ids;
  if (!params.ignore_eos) tokens.insert(tokens.end(), model_stop_tokens.begin(), model_stop_tokens.end());
  return StopMatcher(params.stop, std::move(tokens), params.max_tokens);
}

StopStep StopMatcher::push(std::int32_t token, std::string_view text) {
  if (finished_) throw std::logic_error("StopMatcher: a token was pushed after the sequence finished");
  ++tokens_seen_;
  StopStep step;
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) {
    step.text = release();  // held back for a stop string that can no longer come
    step.finish = FinishReason::stop;
    step.stop_token = token;
    return step;
  }
  pending_ += text;
  if (auto match = first_match()) {
    step.text = pending_.substr(0, match->start);
    step.finish = FinishReason::stop;
    step.stop_string = stop_strings_[match->which];
    pending_.clear();
    finished_ = true;
    return step;
  }
  if (tokens_seen_ >= max_tokens_) {
    step.text = release();
    step.finish = FinishReason::length;
    return step;
  }
  std::size_t held = longest_held_suffix();
  step.text = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return step;
}

std::string StopMatcher::release() {
  finished_ = true;
  return std::exchange(pending_, {});
}

// Every earlier occurrence would have been found by an earlier step, and one that started in
// text already emitted is impossible (that text was held back), so pending_ is all to search.
std::optional<StopMatcher::Match> StopMatcher::first_match() const {
  std::optional<Match> best;
  for (std::size_t i = 0; i < stop_strings_.size(); ++i) {
    std::size_t start = std::string_view(pending_).find(stop_strings_[i]);
    if (start == std::string_view::npos) continue;
    Match match{start, start + stop_strings_[i].size(), i};
    if (!best || match.end < best->end || (match.end == best->end && match.start < best->start)) best = match;
  }
  return best;
}

std::size_t StopMatcher::longest_held_suffix() const {
  std::string_view text = pending_;
  std::size_t longest = 0;
  for (std::string_view stop : stop_strings_) {
    for (std::size_t length = std::min(stop.size() - 1, text.size()); length > longest; --length) {
      if (text.substr(text.size() - length) == stop.substr(0, length)) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

}  // namespace mqlm::model
