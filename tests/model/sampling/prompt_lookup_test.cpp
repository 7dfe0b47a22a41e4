#include "model/sampling/prompt_lookup.hpp"

#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace mqlm::model {
namespace {

using Tokens = std::vector<std::int32_t>;

TEST(PromptLookup, TheLongestRecurringNgramGivesWhatFollowedIt) {
  // "1 2 3" recurs at the end; "3" alone recurs later (at 7), but the longer match wins.
  const Tokens tokens = {1, 2, 3, 4, 5, 6, 3, 9, 9, 1, 2, 3};
  EXPECT_EQ(find_draft(tokens, {3, 4, 4096}).tokens, (Tokens{4, 5, 6, 3}));
  EXPECT_EQ(find_draft(tokens, {3, 2, 4096}).tokens, (Tokens{4, 5}));
  // Looking at unigrams only, the most recent earlier "3" is the one followed by 9.
  EXPECT_EQ(find_draft(tokens, {1, 4, 4096}).tokens, (Tokens{9, 9, 1, 2}));
}

TEST(PromptLookup, TheMostRecentOccurrenceIsUsedAndTheRepeatGoesOnPastTheEnd) {
  // "7 8" last came before "2 7 8": the sequence is taken to go on "2 7 8", then "2 7" again.
  const Tokens tokens = {7, 8, 1, 7, 8, 2, 7, 8};
  EXPECT_EQ(find_draft(tokens, {2, 5, 4096}).tokens, (Tokens{2, 7, 8, 2, 7}));
  // A token repeated: the n-gram may overlap itself.
  EXPECT_EQ(find_draft(Tokens{5, 5, 5, 5}, {3, 4, 4096}).tokens, (Tokens{5, 5, 5, 5}));
}

TEST(PromptLookup, NothingWhenNoNgramRecursOrTheWindowHidesIt) {
  EXPECT_TRUE(find_draft(Tokens{1, 2, 3, 4}, {3, 4, 4096}).tokens.empty());
  EXPECT_TRUE(find_draft(Tokens{1}, {3, 4, 4096}).tokens.empty());
  EXPECT_TRUE(find_draft(Tokens{}, {3, 4, 4096}).tokens.empty());
  EXPECT_TRUE(find_draft(Tokens{1, 2, 1}, {3, 0, 4096}).tokens.empty());
  const Tokens far = {1, 2, 9, 9, 9, 8, 7, 6, 1};
  EXPECT_EQ(find_draft(far, {3, 4, 4096}).tokens, (Tokens{2, 9, 9, 9}));
  EXPECT_TRUE(find_draft(far, {3, 4, 5}).tokens.empty());
}

TEST(PromptLookup, TheMatchCountsHowFarTheSequenceRepeatsTheSourceAndMayHaveAFloor) {
  // "5 1 2 3" ends the sequence and precedes the draft's source too: four tokens match.
  const Tokens tokens = {9, 5, 1, 2, 3, 4, 8, 5, 1, 2, 3};
  const PromptDraft draft = find_draft(tokens, {3, 2, 4096});
  EXPECT_EQ(draft.tokens, (Tokens{4, 8}));
  EXPECT_EQ(draft.matched, 4u);
  // A period-2 loop matches as far back as it goes, up to kMatchCounted.
  Tokens loop;
  for (int i = 0; i < 100; ++i) loop.push_back(i % 2);
  EXPECT_EQ(find_draft(loop, {3, 4, 4096}).matched, PromptDraft::kMatchCounted);
  // With a floor of two tokens a lone recurring token is no match.
  const Tokens once = {1, 2, 3, 4, 5, 6, 3};
  EXPECT_EQ(find_draft(once, {3, 4, 4096, 1}).tokens, (Tokens{4, 5, 6, 3}));
  EXPECT_EQ(find_draft(once, {3, 4, 4096, 1}).matched, 1u);
  EXPECT_TRUE(find_draft(once, {3, 4, 4096, 2}).tokens.empty());
}

TEST(PromptLookup, AcceptedDraftsAreTheLongestPrefixTheArgmaxAgreesWith) {
  EXPECT_EQ(accepted_drafts(Tokens{4, 5, 6}, Tokens{4, 5, 6, 7}), 3u);
  EXPECT_EQ(accepted_drafts(Tokens{4, 5, 6}, Tokens{4, 9, 6, 7}), 1u);
  EXPECT_EQ(accepted_drafts(Tokens{4, 5, 6}, Tokens{1, 5, 6, 7}), 0u);
  EXPECT_EQ(accepted_drafts(Tokens{}, Tokens{3}), 0u);
  EXPECT_THROW(accepted_drafts(Tokens{4, 5}, Tokens{4, 5}), std::invalid_argument);
}

}  // namespace
}  // namespace mqlm::model
