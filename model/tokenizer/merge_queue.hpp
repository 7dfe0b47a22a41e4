// The merge loop both tokenizers share: symbols start as characters (SentencePiece) or bytes
// (byte-level BPE), and the best-ranked adjacent pair is merged, the leftmost among equals,
// until no adjacent pair merges. A heap of candidate pairs keeps it O(n log n) in the symbols.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace mqlm::model::merging {

struct Symbol {
  std::size_t start = 0;   // byte offset in the text being merged
  std::size_t length = 0;  // 0 once merged into its left neighbour
  std::ptrdiff_t prev = -1, next = -1;  // live neighbours, -1: none
  std::int32_t id = -1;    // its token, -1: none (a SentencePiece character outside the vocabulary)
};

struct PairMerge {
  std::uint32_t rank = 0;  // lower merges first
  std::int32_t merged = -1;
};

// Symbols laid out one after another over the text, from per-symbol (length, id).
inline void link(std::vector<Symbol>& symbols) {
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    symbols[i].prev = static_cast<std::ptrdiff_t>(i) - 1;
    symbols[i].next = i + 1 < symbols.size() ? static_cast<std::ptrdiff_t>(i) + 1 : -1;
  }
}

// find(left, right) -> std::optional<PairMerge>: whether two adjacent symbols merge, and into what.
template <typename Find>
void merge_symbols(std::vector<Symbol>& symbols, Find find) {
  struct Candidate {
    std::uint32_t rank;
    std::ptrdiff_t left, right;
    std::size_t length;  // of the pair when found: a stale candidate no longer adds up to it
    std::int32_t merged;
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  auto consider = [&](std::ptrdiff_t left, std::ptrdiff_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<std::size_t>(left)];
    const Symbol& r = symbols[static_cast<std::size_t>(right)];
    if (std::optional<PairMerge> m = find(l, r)) {
      queue.push({m->rank, left, right, l.length + r.length, m->merged});
    }
  };
  for (std::size_t i = 1; i < symbols.size(); ++i) {
    consider(static_cast<std::ptrdiff_t>(i) - 1, static_cast<std::ptrdiff_t>(i));
  }
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<std::size_t>(c.left)];
    Symbol& r = symbols[static_cast<std::size_t>(c.right)];
    if (l.length == 0 || r.length == 0 || l.next != c.right || l.length + r.length != c.length) {
      continue;
    }
    l.length += r.length;
    l.id = c.merged;
    r.length = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<std::size_t>(r.next)].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
}

// Calls f(symbol) for the symbols left after merging, in text order.
template <typename F>
void for_each_live(const std::vector<Symbol>& symbols, F f) {
  for (std::ptrdiff_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) {
    f(symbols[static_cast<std::size_t>(i)]);
  }
}

}  // namespace mqlm::model::merging
