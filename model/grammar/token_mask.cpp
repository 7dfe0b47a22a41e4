#include "model/grammar/token_mask.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace mqlm::model::grammar {

TokenTrie::TokenTrie(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {
  std::vector<std::int32_t> order(pieces_.size());
  std::iota(order.begin(), order.end(), 0);
  std::erase_if(order, [&](std::int32_t t) { return pieces_[static_cast<std::size_t>(t)].empty(); });
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return pieces_[static_cast<std::size_t>(a)] < pieces_[static_cast<std::size_t>(b)];
  });
  std::vector<std::uint32_t> path;  // the node of each byte of the previous piece
  const std::string* previous = nullptr;
  for (std::int32_t token : order) {
    const std::string& piece = pieces_[static_cast<std::size_t>(token)];
    std::size_t common = 0;
    if (previous != nullptr) {
      while (common < previous->size() && common < piece.size() && (*previous)[common] == piece[common]) ++common;
    }
    // The previous piece's nodes past the shared prefix are done: their subtrees end here.
    for (std::size_t d = common; d < path.size(); ++d) nodes_[path[d]].skip = static_cast<std::uint32_t>(nodes_.size());
    path.resize(common);
    for (std::size_t d = common; d < piece.size(); ++d) {
      path.push_back(static_cast<std::uint32_t>(nodes_.size()));
      nodes_.push_back(Node{.byte = static_cast<std::uint8_t>(piece[d]),
                            .depth = static_cast<std::uint16_t>(d + 1),
                            .skip = 0,
                            .tokens_begin = static_cast<std::uint32_t>(tokens_.size()),
                            .tokens_end = static_cast<std::uint32_t>(tokens_.size())});
    }
    Node& last = nodes_[path.back()];
    if (last.tokens_end != tokens_.size()) last.tokens_begin = last.tokens_end = static_cast<std::uint32_t>(tokens_.size());
    tokens_.push_back(token);
    last.tokens_end = static_cast<std::uint32_t>(tokens_.size());
    max_depth_ = std::max(max_depth_, piece.size());
    previous = &piece;
  }
  for (std::uint32_t node : path) nodes_[node].skip = static_cast<std::uint32_t>(nodes_.size());
}

std::size_t TokenConstraint::WordsHash::operator()(const std::vector<std::uint32_t>& words) const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (std::uint32_t w : words) h = (h ^ w) * 1099511628211ull;
  return static_cast<std::size_t>(h);
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                                 std::vector<std::int32_t> end_tokens)
    : matcher_(std::move(grammar)), trie_(std::move(trie)), end_tokens_(std::move(end_tokens)),
      levels_(trie_->max_depth() + 1) {}

TokenConstraint::StateId TokenConstraint::intern(const StackSet& stacks) {
  auto [it, inserted] = state_ids_.try_emplace(stacks.words(), static_cast<StateId>(states_.size()));
  if (inserted) {
    states_.push_back(stacks);
    moves_.emplace_back();
    moves_.back().fill(kUnknown);
  }
  return it->second;
}

TokenConstraint::StateId TokenConstraint::move(StateId from, std::uint8_t byte) {
  StateId& to = moves_[static_cast<std::size_t>(from)][byte];
  if (to != kUnknown) return to;
  matcher_.walker().step(states_[static_cast<std::size_t>(from)], byte, next_);
  StateId found = kDead;
  if (!next_.empty()) {
    auto known = state_ids_.find(next_.words());
    if (known != state_ids_.end()) found = known->second;
    else if (states_.size() < kHardMaxStates) found = intern(next_);  // grows moves_: `to` is stale
  }
  moves_[static_cast<std::size_t>(from)][byte] = found;
  return found;
}

void TokenConstraint::forget_states() {
  states_.clear();
  moves_.clear();
  state_ids_.clear();
  cache_.clear();
}

bool TokenConstraint::is_end(std::int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

std::span<const std::uint32_t> TokenConstraint::allowed() {
  if (states_.size() >= kMaxStates) forget_states();
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  const StateId start = intern(matcher_.stacks());
  if (auto it = cache_.find(start); it != cache_.end()) {
    ++cached_;
    return it->second;
  }
  ++walked_;
  std::vector<std::uint32_t>& mask = cache_[start];
  walk(mask);
  return mask;
}

// The tokens whose every byte some stack can take; the end tokens where the text may end, and
// only they where it must.
void TokenConstraint::walk(std::vector<std::uint32_t>& mask) {
  mask.assign((trie_->size() + 31) / 32, 0u);
  auto allow = [&](std::int32_t token) {
    if (token >= 0 && static_cast<std::size_t>(token) < trie_->size()) mask[token / 32] |= 1u << (token % 32);
  };
  if (matcher_.can_end()) {
    for (std::int32_t token : end_tokens_) allow(token);
  }
  if (matcher_.must_end()) return;
  const std::vector<TokenTrie::Node>& nodes = trie_->nodes();
  levels_[0] = intern(matcher_.stacks());
  for (std::size_t i = 0; i < nodes.size();) {
    const TokenTrie::Node& node = nodes[i];
    const StateId to = move(levels_[node.depth - 1], node.byte);
    if (to == kDead) {
      i = node.skip;
      continue;
    }
    levels_[node.depth] = to;
    for (std::int32_t token : trie_->tokens(node)) {
      if (!is_end(token)) allow(token);
    }
    ++i;
  }
}

bool TokenConstraint::accept(std::int32_t token) {
  if (token < 0 || static_cast<std::size_t>(token) >= trie_->size()) return false;
  if (is_end(token)) return matcher_.can_end();
  const std::string& piece = trie_->piece(token);
  return !piece.empty() && matcher_.advance(piece);
}

}  // namespace mqlm::model::grammar
