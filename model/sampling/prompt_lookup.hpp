// Prompt-lookup decoding (speculative decoding's cheapest drafter): the tokens that followed the
// last time the sequence's latest n-gram appeared are a guess at what follows it now; a greedy
// step verifies them all at once, and keeps the guesses the model's argmax agrees with. Text that
// repeats its prompt (code edits, quotes, summaries, a loop) is where the guesses hit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mqlm::model {

struct PromptLookup {
  std::uint32_t max_ngram = 3;    // the n-grams tried, longest first, down to min_ngram
  std::uint32_t draft_max = 4;    // tokens proposed at most
  std::uint32_t window = 4096;    // how far back, in tokens, the n-gram is looked for
  std::uint32_t min_ngram = 1;    // the shortest n-gram that counts as a match
};

// A guess and how much backs it: `matched` tokens before the draft's source equal the tokens that
// end the sequence (at least the n-gram; counted up to kMatchCounted). A long match is a text
// repeating itself, a short one may be chance.
struct PromptDraft {
  static constexpr std::uint32_t kMatchCounted = 64;
  std::vector<std::int32_t> tokens;
  std::uint32_t matched = 0;
};

// lookup.draft_max tokens that followed the most recent earlier occurrence of the longest n-gram
// (n from max_ngram down to min_ngram) that ends `tokens`, the repeat carried on past the end of
// `tokens` when it is shorter; none when no such n-gram recurs.
PromptDraft find_draft(std::span<const std::int32_t> tokens, const PromptLookup& lookup);

// How many drafts the greedy verification keeps: the longest prefix of `drafts` in which each
// draft is the argmax of the row before it (choices[i] is the argmax after the row of the
// sequence's last token and i drafts; choices has drafts.size() + 1 rows).
std::size_t accepted_drafts(std::span<const std::int32_t> drafts, std::span<const std::int32_t> choices);

}  // namespace mqlm::model
