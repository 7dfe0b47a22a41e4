// Where a parse of a grammar (grammar.hpp) stands after some bytes, and how it moves on by one.
//
// A parse is a stack of element positions, the innermost last: the byte set to match next, or,
// when the stack is empty, a parse that is complete. The grammar may be ambiguous for a few bytes
// (whitespace that may or may not come, an optional property), so the state is a set of such
// stacks. Rule references are expanded as soon as they are on top, so every stack's top is a byte
// set; a reference in tail position replaces its caller's frame, so a repetition written as right
// recursion does not grow the stack.
//
// Bounds: a stack deeper than kMaxStackDepth (JSON nested that deep), stacks past kMaxStacks and
// expansions past kMaxExpansions in one step are dropped: the matcher may then refuse text the grammar allows, never allow text
// it refuses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "model/grammar/grammar.hpp"

namespace mqlm::model::grammar {

inline constexpr std::size_t kMaxStackDepth = 256;
inline constexpr std::size_t kMaxStacks = 256;
// Rule expansions in one step: a grammar with left recursion (which the compiler never makes)
// runs out of them rather than forever.
inline constexpr std::size_t kMaxExpansions = 1 << 16;

// Stacks stored flat, [length, positions...] each, without duplicates; words() is the set's
// identity (the mask cache's key).
class StackSet {
 public:
  void clear() {
    words_.clear();
    count_ = 0;
  }
  bool empty() const { return count_ == 0; }
  std::size_t size() const { return count_; }
  bool has_complete() const;  // some stack is empty: the parse may end here
  bool all_complete() const;  // every stack is empty: nothing may follow
  void add(std::span<const std::uint32_t> stack);
  const std::vector<std::uint32_t>& words() const { return words_; }

  template <class F>
  void for_each(F&& f) const {
    for (std::size_t at = 0; at < words_.size(); at += 1 + words_[at]) {
      f(std::span<const std::uint32_t>(words_.data() + at + 1, words_[at]));
    }
  }

 private:
  std::vector<std::uint32_t> words_;
  std::size_t count_ = 0;
};

// The moves over a grammar, with scratch space of its own: one per thread.
class GrammarWalker {
 public:
  explicit GrammarWalker(std::shared_ptr<const Grammar> grammar);
  const Grammar& grammar() const { return *grammar_; }
  // The stacks before any byte.
  StackSet start();
  // `to` (cleared first): the stacks of `from` whose next byte set has b, moved past it.
  void step(const StackSet& from, std::uint8_t b, StackSet& to);

 private:
  void expand(std::vector<std::uint32_t>& stack, StackSet& out, std::size_t depth);
  void advance_top(std::vector<std::uint32_t>& stack) const;

  std::shared_ptr<const Grammar> grammar_;
  std::vector<std::vector<std::uint32_t>> scratch_;  // (kMaxStackDepth + 1) stacks, one per expansion depth
  std::size_t budget_ = 0;                           // expansions left in this step
};

// One parse's state: what text has been accepted so far.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  // Moves past the bytes; false (and the state unchanged) when the grammar does not allow them.
  bool advance(std::string_view bytes);
  bool can_end() const { return stacks_.has_complete(); }
  bool must_end() const { return stacks_.all_complete(); }
  const StackSet& stacks() const { return stacks_; }
  GrammarWalker& walker() { return walker_; }

 private:
  GrammarWalker walker_;
  StackSet stacks_;
  StackSet next_;
};

}  // namespace mqlm::model::grammar
