#include "model/sampling/prompt_lookup.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <stdexcept>

namespace mqlm::model {

namespace {

// Where the most recent earlier occurrence of tokens' last n tokens starts (searched from `from`
// on), or nothing.
std::optional<std::size_t> latest_occurrence(std::span<const std::int32_t> tokens, std::size_t n, std::size_t from) {
  const std::size_t end = tokens.size();
  const auto suffix = tokens.subspan(end - n);
  // Occurrences that end before the suffix itself does; the latest first, so the guess follows the
  // most recent context.
  for (std::size_t start = end - n; start-- > from;) {
    if (std::equal(suffix.begin(), suffix.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start))) return start;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::int32_t> find_draft(std::span<const std::int32_t> tokens, const PromptLookup& lookup) {
  if (lookup.draft_max == 0 || tokens.size() < 2) return {};
  const std::size_t from = tokens.size() > lookup.window ? tokens.size() - lookup.window : 0;
  const std::size_t longest = std::min<std::size_t>(lookup.max_ngram, tokens.size() - 1);
  for (std::size_t n = longest; n >= 1; --n) {
    const std::optional<std::size_t> start = latest_occurrence(tokens, n, from);
    if (!start) continue;
    const auto follows = tokens.subspan(*start + n);
    const std::size_t count = std::min<std::size_t>(lookup.draft_max, follows.size());
    return {follows.begin(), follows.begin() + static_cast<std::ptrdiff_t>(count)};
  }
  return {};
}

std::size_t accepted_drafts(std::span<const std::int32_t> drafts, std::span<const std::int32_t> choices) {
  if (choices.size() != drafts.size() + 1) {
    throw std::invalid_argument("accepted_drafts: " + std::to_string(drafts.size()) + " drafts need " +
                                std::to_string(drafts.size() + 1) + " rows of choices, not " +
                                std::to_string(choices.size()));
  }
  std::size_t accepted = 0;
  while (accepted < drafts.size() && choices[accepted] == drafts[accepted]) ++accepted;
  return accepted;
}

}  // namespace mqlm::model
