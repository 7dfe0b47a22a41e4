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
  EXPECT_EQ(find_draft(tokens, {3, 4, 4096}), (Tokens{4, 5, 6, 3}));
  EXPECT_EQ(find_draft(tokens, {3, 2, 4096}), (Tokens{4, 5}));
  // Looking at unigrams only, the most recent earlier "3" is the one followed by 9.
  EXPECT_EQ(find_draft(tokens, {1, 4, 4096}), (Tokens{9, 9, 1, 2}));
}

TEST(PromptLookup, TheMostRecentOccurrenceIsUsedAndTheDraftStopsAtTheEnd) {
  const Tokens tokens = {7, 8, 1, 7, 8, 2, 7, 8};
  EXPECT_EQ(find_draft(tokens, {2, 5, 4096}), (Tokens{2, 7, 8}));
  // A token repeated: the n-gram may overlap itself.
  EXPECT_EQ(find_draft(Tokens{5, 5, 5, 5}, {3, 4, 4096}), (Tokens{5}));
}

TEST(PromptLookup, NothingWhenNoNgramRecursOrTheWindowHidesIt) {
  EXPECT_TRUE(find_draft(Tokens{1, 2, 3, 4}, {3, 4, 4096}).empty());
  EXPECT_TRUE(find_draft(Tokens{1}, {3, 4, 4096}).empty());
  EXPECT_TRUE(find_draft(Tokens{}, {3, 4, 4096}).empty());
  EXPECT_TRUE(find_draft(Tokens{1, 2, 1}, {3, 0, 4096}).empty());
  const Tokens far = {1, 2, 9, 9, 9, 8, 7, 6, 1};
  EXPECT_EQ(find_draft(far, {3, 4, 4096}), (Tokens{2, 9, 9, 9}));
  EXPECT_TRUE(find_draft(far, {3, 4, 5}).empty());
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
