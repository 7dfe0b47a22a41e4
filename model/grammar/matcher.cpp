#include "model/grammar/matcher.hpp"

#include <algorithm>
#include <utility>

namespace mqlm::model::grammar {

bool StackSet::has_complete() const {
  for (std::size_t at = 0; at < words_.size(); at += 1 + words_[at]) {
    if (words_[at] == 0) return true;
  }
  return false;
}

bool StackSet::all_complete() const { return count_ > 0 && words_.size() == count_; }

void StackSet::add(std::span<const std::uint32_t> stack) {
  if (count_ >= kMaxStacks) return;
  for (std::size_t at = 0; at < words_.size(); at += 1 + words_[at]) {
    if (words_[at] == stack.size() && std::equal(stack.begin(), stack.end(), words_.begin() + static_cast<std::ptrdiff_t>(at) + 1)) {
      return;
    }
  }
  words_.push_back(static_cast<std::uint32_t>(stack.size()));
  words_.insert(words_.end(), stack.begin(), stack.end());
  ++count_;
}

GrammarWalker::GrammarWalker(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), scratch_(kMaxStackDepth + 1) {}

StackSet GrammarWalker::start() {
  StackSet stacks;
  std::vector<std::uint32_t> stack;
  budget_ = kMaxExpansions;
  for (std::uint32_t alternative : grammar_->rules.at(grammar_->root)) {
    stack.assign(1, alternative);
    expand(stack, stacks, 0);
  }
  return stacks;
}

// The top moves to the element after it; an alternative's end returns to the caller's frame.
void GrammarWalker::advance_top(std::vector<std::uint32_t>& stack) const {
  stack.back() += 1;
  if (grammar_->elements[stack.back()].kind == ElementKind::end) stack.pop_back();
}

void GrammarWalker::expand(std::vector<std::uint32_t>& stack, StackSet& out, std::size_t depth) {
  for (;;) {
    if (stack.empty()) {
      out.add(stack);
      return;
    }
    const Element element = grammar_->elements[stack.back()];
    if (element.kind == ElementKind::end) {  // an empty alternative
      stack.pop_back();
      continue;
    }
    if (element.kind == ElementKind::bytes) {
      out.add(stack);
      return;
    }
    // Nested too deep, or an expansion that does not end (left recursion): this parse is dropped.
    if (stack.size() >= kMaxStackDepth || depth >= kMaxStackDepth || budget_ == 0) return;
    --budget_;
    advance_top(stack);
    const std::vector<std::uint32_t>& alternatives = grammar_->rules[element.value];
    for (std::size_t i = 0; i + 1 < alternatives.size(); ++i) {
      std::vector<std::uint32_t>& copy = scratch_[depth];
      copy.assign(stack.begin(), stack.end());
      copy.push_back(alternatives[i]);
      expand(copy, out, depth + 1);
    }
    stack.push_back(alternatives.back());
  }
}

void GrammarWalker::step(const StackSet& from, std::uint8_t b, StackSet& to) {
  to.clear();
  budget_ = kMaxExpansions;
  std::vector<std::uint32_t>& moved = scratch_[kMaxStackDepth];
  from.for_each([&](std::span<const std::uint32_t> stack) {
    if (stack.empty()) return;
    const Element element = grammar_->elements[stack.back()];
    if (!grammar_->byte_sets[element.value].has(b)) return;
    moved.assign(stack.begin(), stack.end());
    advance_top(moved);
    expand(moved, to, 0);
  });
}

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : walker_(std::move(grammar)), stacks_(walker_.start()) {}

bool Matcher::advance(std::string_view bytes) {
  StackSet state = stacks_;
  for (char c : bytes) {
    walker_.step(state, static_cast<std::uint8_t>(c), next_);
    if (next_.empty()) return false;
    std::swap(state, next_);
  }
  stacks_ = std::move(state);
  return true;
}

}  // namespace mqlm::model::grammar
