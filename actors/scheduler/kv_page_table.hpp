// The scheduler's map of the KV cache: fixed-size pages, a block table per sequence, and the
// prefix cache. A full page is keyed by a chained hash of (model, the tokens of every page up to
// and including it), so two sequences that share a prefix share its pages, counted by
// reference. A page whose last user is gone keeps its contents and key and waits, least
// recently used first, to be reused by a matching prefix or evicted when free pages run out.
//
// Owned by the scheduler actor alone; a pure data structure (no clock, no randomness).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "messages/cache.hpp"

namespace mqlm::actors {

struct PageTableStats {
  std::uint32_t total = 0;
  std::uint32_t in_use = 0;    // referenced by at least one sequence
  std::uint32_t cached = 0;    // unreferenced, holding a keyed prefix page, evictable
  std::uint32_t free = 0;      // unreferenced and empty
  std::uint64_t references = 0;  // sum of all pages' reference counts
  std::uint64_t prefix_hits = 0;   // pages reused from the prefix cache
  std::uint64_t evictions = 0;     // cached pages given to other contents
};

// A keyed page given to other contents, with what identifies its old contents.
struct EvictedPage {
  std::uint32_t page = 0;
  messages::KvPageId id;
};

class KvPageTable {
 public:
  KvPageTable(std::uint32_t pages, std::uint32_t page_size);

  std::uint32_t page_size() const { return page_size_; }

  // Starts a sequence: reuses the cached pages of the longest full-page prefix of `tokens`
  // (never all of them: at least the last token is left to compute, so there are logits) and
  // returns how many tokens they cover. The pages join the sequence's block table.
  std::uint32_t begin(std::uint64_t sequence, std::uint64_t model, std::span<const std::int32_t> tokens);

  // Makes the sequence's block table cover `tokens` positions; false (and nothing changed) if
  // there are not enough free or evictable pages.
  bool reserve(std::uint64_t sequence, std::uint32_t tokens);

  // Cuts the sequence's block table back to cover `tokens` positions: the pages past them (taken
  // by reserve for positions a step computed but did not keep, as rejected drafts) go back. Their
  // contents are never read (attention reads a position's past only) and are written over.
  void truncate(std::uint64_t sequence, std::uint32_t tokens);

  // Records that the sequence's KV now holds these tokens (its whole history so far): pages that
  // became full get their key and can be shared from now on.
  void computed(std::uint64_t sequence, std::span<const std::int32_t> history);

  // Drops the sequence: its pages lose a reference; keyed ones stay cached, others are freed.
  void release(std::uint64_t sequence);

  // The chained keys of the pages begin() could share for these tokens (the full pages before the
  // last token), and how many of them, from the first, the table holds.
  std::vector<std::uint64_t> prefix_keys(std::uint64_t model, std::span<const std::int32_t> tokens) const;
  std::size_t held_prefix(std::span<const std::uint64_t> keys) const;

  // Appends a page whose contents come from elsewhere (the cache-writer) to a sequence whose pages
  // so far are all full and keyed: `id` must continue its chain (parent = its last key, the key
  // recomputed from model and `tokens`, which must equal id.tokens) and be held nowhere in the
  // table. Returns the page, now keyed and referenced by the sequence, or nothing (no page free
  // or evictable, or `id` does not fit).
  std::optional<std::uint32_t> adopt(std::uint64_t sequence, const messages::KvPageId& id,
                                     std::span<const std::int32_t> tokens);
  // Drops a page's key (its contents are not what the key says: a restore that failed); an
  // unreferenced page becomes free.
  void forget(std::uint32_t page);

  // With recording on, every keyed page given to other contents is remembered until taken.
  void record_evictions(bool on) { record_evictions_ = on; }
  std::vector<EvictedPage> take_evicted() { return std::exchange(evicted_, {}); }
  // Up to `most` of the unreferenced keyed pages, the most recently used last (what is worth
  // keeping when the cache itself goes, as when the server stops).
  std::vector<EvictedPage> cached_pages(std::size_t most) const;

  const std::vector<std::uint32_t>& block_table(std::uint64_t sequence) const;
  bool has(std::uint64_t sequence) const { return sequences_.contains(sequence); }
  std::size_t sequences() const { return sequences_.size(); }
  PageTableStats stats() const;
  // Pages a new sequence of this length could get now (free plus evictable).
  std::uint32_t available() const;

 private:
  struct Page {
    std::uint32_t references = 0;
    std::optional<std::uint64_t> key;          // set once the page is full and computed
    std::uint64_t parent = 0;                  // with the key: the previous page's key
    std::vector<std::int32_t> tokens;          // with the key: the page's tokens
    std::list<std::uint32_t>::iterator lru;    // position in cached_ when unreferenced and keyed
  };
  struct Sequence {
    std::uint64_t model = 0;
    std::vector<std::uint32_t> pages;
    std::vector<std::uint64_t> keys;  // chained key of each full, computed page, in order
  };

  std::optional<std::uint32_t> take_page();
  void unreference(std::uint32_t page);
  void publish(std::uint32_t page, std::uint64_t key, std::uint64_t parent, std::span<const std::int32_t> tokens);
  std::uint64_t chain(std::uint64_t previous, std::uint64_t model, std::span<const std::int32_t> page_tokens) const;

  std::uint32_t page_size_;
  std::vector<Page> pages_;
  std::vector<std::uint32_t> free_;             // empty pages, as a stack
  std::list<std::uint32_t> cached_;             // keyed, unreferenced pages; front = least recent
  std::unordered_map<std::uint64_t, std::uint32_t> by_key_;
  std::unordered_map<std::uint64_t, Sequence> sequences_;
  std::uint64_t prefix_hits_ = 0, evictions_ = 0;
  bool record_evictions_ = false;
  std::vector<EvictedPage> evicted_;
};

}  // namespace mqlm::actors
