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

// How many tokens ending at `source_end` equal the ones ending the sequence (up to `most`).
std::uint32_t match_length(std::span<const std::int32_t> tokens, std::size_t source_end, std::uint32_t most) {
  std::uint32_t length = 0;
  while (length < most && length < source_end && tokens[source_end - 1 - length] == tokens[tokens.size() - 1 - length])
    ++length;
  return length;
}

}  // namespace

PromptDraft find_draft(std::span<const std::int32_t> tokens, const PromptLookup& lookup) {
  if (lookup.draft_max == 0 || tokens.size() < 2) return {};
  const std::size_t from = tokens.size() > lookup.window ? tokens.size() - lookup.window : 0;
  const std::size_t longest = std::min<std::size_t>(lookup.max_ngram, tokens.size() - 1);
  for (std::size_t n = longest; n >= std::max<std::size_t>(lookup.min_ngram, 1); --n) {
    const std::optional<std::size_t> start = latest_occurrence(tokens, n, from);
    if (!start) continue;
    // The sequence goes on as it did after the source; where that runs into the end (a loop whose
    // period is shorter than the draft), it goes on as the draft itself does.
    PromptDraft draft{{}, match_length(tokens, *start + n, PromptDraft::kMatchCounted)};
    for (std::size_t source = *start + n; draft.tokens.size() < lookup.draft_max; ++source)
      draft.tokens.push_back(source < tokens.size() ? tokens[source] : draft.tokens[source - tokens.size()]);
    return draft;
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
