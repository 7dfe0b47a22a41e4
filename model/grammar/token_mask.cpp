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

bool TokenConstraint::is_end(std::int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

std::span<const std::uint32_t> TokenConstraint::allowed() {
  const std::vector<std::uint32_t>& key = matcher_.stacks().words();
  if (auto it = cache_.find(key); it != cache_.end()) {
    ++cached_;
    return it->second;
  }
  ++walked_;
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  std::vector<std::uint32_t>& mask = cache_[key];
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
  GrammarWalker& walker = matcher_.walker();
  const StackSet& start = matcher_.stacks();
  for (std::size_t i = 0; i < nodes.size();) {
    const TokenTrie::Node& node = nodes[i];
    const StackSet& from = node.depth == 1 ? start : levels_[node.depth - 1];
    walker.step(from, node.byte, levels_[node.depth]);
    if (levels_[node.depth].empty()) {
      i = node.skip;
      continue;
    }
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
