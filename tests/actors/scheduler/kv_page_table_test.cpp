// The KV page table: block tables, prefix sharing by chained hash, LRU eviction, and that every
// reference comes back whatever the order of events.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <stdexcept>

#include "actors/scheduler/kv_page_table.hpp"

namespace mqlm::actors {
namespace {

std::vector<std::int32_t> tokens(std::size_t n, std::int32_t first = 0) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = first + static_cast<std::int32_t>(i);
  return t;
}

TEST(KvPageTableTest, ReserveAndReleaseReturnEveryPage) {
  KvPageTable table(8, 4);
  table.begin(1, 0, {});
  ASSERT_TRUE(table.reserve(1, 9));  // 3 pages
  EXPECT_EQ(table.block_table(1).size(), 3u);
  ASSERT_TRUE(table.reserve(1, 12));  // still 3
  EXPECT_EQ(table.block_table(1).size(), 3u);
  EXPECT_EQ(table.stats().in_use, 3u);
  table.release(1);
  auto s = table.stats();
  EXPECT_EQ(s.free, 8u);
  EXPECT_EQ(s.references, 0u);
  EXPECT_FALSE(table.has(1));
}

// Speculative decoding's rollback: pages reserved for drafts that were not kept go back; a
// computed full page (shared, keyed) is never cut.
TEST(KvPageTableTest, TruncateGivesBackThePagesPastTheKeptLength) {
  KvPageTable table(8, 4);
  table.begin(1, 0, {});
  ASSERT_TRUE(table.reserve(1, 12));  // positions 0 to 11
  const std::vector<std::uint32_t> reserved = table.block_table(1);
  table.computed(1, tokens(8));       // the first two pages full and keyed
  table.truncate(1, 9);               // position 8 kept: still three pages
  EXPECT_EQ(table.block_table(1), reserved);
  table.truncate(1, 8);
  EXPECT_EQ(table.block_table(1), (std::vector<std::uint32_t>{reserved[0], reserved[1]}));
  EXPECT_EQ(table.stats().in_use, 2u);
  EXPECT_EQ(table.stats().free, 6u);
  EXPECT_THROW(table.truncate(1, 7), std::logic_error);
  table.release(1);
  EXPECT_EQ(table.stats().references, 0u);
}

TEST(KvPageTableTest, FullPagesOfACommonPrefixAreShared) {
  KvPageTable table(16, 4);
  auto a = tokens(14);  // 3 full pages and 2 tokens
  EXPECT_EQ(table.begin(1, 7, a), 0u);
  ASSERT_TRUE(table.reserve(1, 14));
  table.computed(1, a);

  auto b = tokens(14);
  b[9] = 999;  // differs in the third page
  EXPECT_EQ(table.begin(2, 7, b), 8u);  // two pages reused while the first sequence runs
  EXPECT_EQ(table.block_table(2)[0], table.block_table(1)[0]);
  EXPECT_EQ(table.block_table(2)[1], table.block_table(1)[1]);
  EXPECT_EQ(table.stats().references, 4u + 2u);
  EXPECT_EQ(table.stats().prefix_hits, 2u);

  table.release(1);  // its three full pages stay cached: two still used by 2, one unreferenced
  EXPECT_EQ(table.stats().cached, 1u);
  EXPECT_EQ(table.begin(3, 7, a), 12u);  // all three full pages of a
  EXPECT_EQ(table.begin(4, 8, a), 0u);   // another model: nothing shared
  table.release(2);
  table.release(3);
  table.release(4);
  auto s = table.stats();
  EXPECT_EQ(s.references, 0u);
  EXPECT_EQ(s.cached + s.free, 16u);
}

TEST(KvPageTableTest, TheLastTokenIsAlwaysLeftToCompute) {
  KvPageTable table(8, 4);
  auto a = tokens(8);  // exactly two pages
  table.begin(1, 0, a);
  ASSERT_TRUE(table.reserve(1, 8));
  table.computed(1, a);
  table.release(1);
  EXPECT_EQ(table.begin(2, 0, a), 4u);  // one page, not two: the last token needs its logits
}

TEST(KvPageTableTest, EvictionTakesTheLeastRecentlyUsedTailFirst) {
  KvPageTable table(4, 2);
  auto a = tokens(5);  // pages: [0,1] [2,3] [4]
  table.begin(1, 0, a);
  ASSERT_TRUE(table.reserve(1, 5));
  table.computed(1, a);
  table.release(1);  // two keyed pages cached, one freed
  auto s = table.stats();
  EXPECT_EQ(s.cached, 2u);
  EXPECT_EQ(s.free, 2u);

  table.begin(2, 0, {});
  ASSERT_TRUE(table.reserve(2, 6));  // 3 pages: 2 free + 1 evicted, the tail [2,3]
  EXPECT_EQ(table.stats().evictions, 1u);
  EXPECT_FALSE(table.reserve(2, 10));  // 5 pages: more than exist
  EXPECT_EQ(table.block_table(2).size(), 3u);  // unchanged by the failed reserve
  table.release(2);
  EXPECT_EQ(table.begin(3, 0, a), 2u);  // the head [0,1] survived, the tail did not
  table.release(3);
}

TEST(KvPageTableTest, RandomEventsNeverLoseAReference) {
  std::mt19937_64 rng(42);
  KvPageTable table(64, 4);
  std::map<std::uint64_t, std::vector<std::int32_t>> live;
  std::uint64_t next = 1;
  for (int round = 0; round < 10000; ++round) {
    int op = static_cast<int>(rng() % 4);
    if (op == 0 || live.empty()) {
      // A prompt from a few shared prefixes, so the cache gets hits.
      std::vector<std::int32_t> prompt = tokens(4 * (rng() % 4), static_cast<std::int32_t>(rng() % 3) * 1000);
      for (std::uint64_t extra = rng() % 7; extra > 0; --extra) prompt.push_back(static_cast<std::int32_t>(rng() % 50));
      std::uint64_t id = next++;
      std::uint32_t cached = table.begin(id, rng() % 2, prompt);
      EXPECT_LE(cached, prompt.empty() ? 0 : prompt.size() - 1);
      if (!table.reserve(id, static_cast<std::uint32_t>(prompt.size()))) {
        table.release(id);
        continue;
      }
      table.computed(id, prompt);
      live[id] = prompt;
    } else if (op == 1) {  // a sequence grows by a token
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      it->second.push_back(static_cast<std::int32_t>(rng() % 50));
      if (table.reserve(it->first, static_cast<std::uint32_t>(it->second.size()))) {
        table.computed(it->first, it->second);
      } else {
        table.release(it->first);  // preempted
        live.erase(it);
      }
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      table.release(it->first);
      live.erase(it);
    }
    std::uint64_t expected_refs = 0;
    for (const auto& [id, t] : live) expected_refs += table.block_table(id).size();
    auto s = table.stats();
    ASSERT_EQ(s.references, expected_refs) << "round " << round;
    ASSERT_EQ(s.in_use + s.cached + s.free, 64u) << "round " << round;
  }
  for (const auto& [id, t] : live) table.release(id);
  auto s = table.stats();
  EXPECT_EQ(s.references, 0u);
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_GT(s.prefix_hits, 100u);
  EXPECT_GT(s.evictions, 0u);
}

// A prefix that leaves the GPU and comes back: with recording on, every keyed page given to other
// contents is reported with its key, parent and tokens; adopt() takes back exactly the pages that
// continue a sequence's chain, and nothing else.
TEST(KvPageTableTest, EvictedPagesComeBackOnlyWhereTheyContinueTheChain) {
  KvPageTable table(4, 4);
  table.record_evictions(true);
  const auto a = tokens(9);  // two full pages before its last token
  table.begin(1, 7, a);
  ASSERT_TRUE(table.reserve(1, 9));
  table.computed(1, a);
  table.release(1);  // pages 0 and 1 stay cached, keyed
  const std::vector<std::uint64_t> keys = table.prefix_keys(7, a);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(table.held_prefix(keys), 2u);
  EXPECT_TRUE(table.take_evicted().empty());

  table.begin(2, 7, tokens(16, 100));
  ASSERT_TRUE(table.reserve(2, 16));  // every page: both of a's are given up
  std::vector<EvictedPage> evicted = table.take_evicted();
  ASSERT_EQ(evicted.size(), 2u);
  std::map<std::uint64_t, messages::KvPageId> by_key;
  for (const EvictedPage& e : evicted) by_key[e.id.key] = e.id;
  ASSERT_TRUE(by_key.contains(keys[0]) && by_key.contains(keys[1]));
  EXPECT_EQ(by_key[keys[0]].parent, 0u);
  EXPECT_EQ(by_key[keys[1]].parent, keys[0]);
  EXPECT_EQ(by_key[keys[1]].tokens, std::vector<std::int32_t>(a.begin() + 4, a.begin() + 8));
  EXPECT_EQ(table.held_prefix(keys), 0u);
  table.release(2);

  table.begin(3, 7, a);
  auto page_tokens = [&](std::size_t i) { return std::span<const std::int32_t>(a).subspan(i * 4, 4); };
  // Out of order, another model's, or other tokens: refused, and nothing changes.
  EXPECT_FALSE(table.adopt(3, by_key[keys[1]], page_tokens(1)));
  EXPECT_FALSE(table.adopt(3, by_key[keys[0]], page_tokens(1)));
  messages::KvPageId forged = by_key[keys[0]];
  forged.tokens[0] += 1;
  EXPECT_FALSE(table.adopt(3, forged, page_tokens(0)));
  EXPECT_TRUE(table.block_table(3).empty());
  // In order: both come back, keyed and shared from now on.
  auto first = table.adopt(3, by_key[keys[0]], page_tokens(0));
  auto second = table.adopt(3, by_key[keys[1]], page_tokens(1));
  ASSERT_TRUE(first && second);
  EXPECT_EQ(table.block_table(3), (std::vector<std::uint32_t>{*first, *second}));
  EXPECT_EQ(table.held_prefix(keys), 2u);
  // A restore that failed: its pages are forgotten, and free once released.
  table.forget(*second);
  EXPECT_EQ(table.held_prefix(keys), 1u);
  table.release(3);
  EXPECT_EQ(table.stats().free + table.stats().cached, 4u);
  EXPECT_EQ(table.stats().cached, 1u);
}

}  // namespace
}  // namespace mqlm::actors
