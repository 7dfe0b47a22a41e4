// Which tokens a grammar allows next, as a bitset over the vocabulary: what constrained sampling
// hands the sampler (bit i of word i / 32 set = token i may be chosen).
//
// The vocabulary's byte pieces are kept as a trie (TokenTrie, one per model); a mask walks it
// depth first, one byte a level, and leaves a whole subtree as soon as no parse survives its
// prefix. The walk moves between the matcher's stack sets through an automaton made as it goes:
// each distinct stack set met is a state, and each (state, byte) move is computed once by the
// matcher and then looked up, so a walk over the whole vocabulary (inside a string) costs a table
// lookup per trie node. Masks are cached by the state they were walked from: inside an unbounded
// string, or at the same place of a repeated structure, the state repeats and the walk is skipped.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/grammar/matcher.hpp"

namespace mqlm::model::grammar {

class TokenTrie {
 public:
  // pieces: token id -> the bytes it stands for; an empty piece (a control token) is never allowed.
  explicit TokenTrie(std::vector<std::string> pieces);
  std::size_t size() const { return pieces_.size(); }
  const std::string& piece(std::int32_t token) const { return pieces_.at(static_cast<std::size_t>(token)); }
  std::size_t node_count() const { return nodes_.size(); }

  struct Node {
    std::uint8_t byte = 0;
    std::uint16_t depth = 0;       // 1 for a piece's first byte
    std::uint32_t skip = 0;        // the node after this one's subtree
    std::uint32_t tokens_begin = 0, tokens_end = 0;  // into tokens_: the tokens whose piece ends here
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  std::span<const std::int32_t> tokens(const Node& node) const {
    return std::span<const std::int32_t>(tokens_).subspan(node.tokens_begin, node.tokens_end - node.tokens_begin);
  }
  std::size_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<Node> nodes_;  // preorder, the root left out
  std::vector<std::int32_t> tokens_;
  std::size_t max_depth_ = 0;
};

// One sequence's constraint: its matcher, the end tokens, and the masks it walked.
class TokenConstraint {
 public:
  // end_tokens: the model's end-of-generation tokens, allowed only where the text is complete
  // and then the only ones allowed.
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                  std::vector<std::int32_t> end_tokens);

  // The tokens allowed next: (ceil(trie size / 32)) words, valid until the next call.
  std::span<const std::uint32_t> allowed();
  // Moves past the token's bytes; false (and nothing changed) when it was not allowed.
  bool accept(std::int32_t token);
  bool complete() const { return matcher_.must_end(); }

  std::uint64_t masks_walked() const { return walked_; }
  std::uint64_t masks_cached() const { return cached_; }

  // Masks kept per sequence (2 KiB to 16 KiB each for vocabularies of 16k to 128k tokens); when
  // full, they start over. Automaton states (512 bytes of moves each): past kMaxStates when a
  // walk starts, they start over; a walk that meets kHardMaxStates (a pathological grammar) goes
  // on without the states it cannot add, refusing the tokens that would reach them (the mask may
  // then refuse text the grammar allows, never allow text it refuses).
  static constexpr std::size_t kMaxCachedMasks = 32;
  static constexpr std::size_t kMaxStates = 1024;
  static constexpr std::size_t kHardMaxStates = 8192;

 private:
  using StateId = std::int16_t;
  static constexpr StateId kDead = -1;     // no parse takes the byte
  static constexpr StateId kUnknown = -2;  // not computed yet

  void walk(std::vector<std::uint32_t>& mask);
  bool is_end(std::int32_t token) const;
  StateId intern(const StackSet& stacks);
  StateId move(StateId from, std::uint8_t byte);
  void forget_states();

  struct WordsHash {
    std::size_t operator()(const std::vector<std::uint32_t>& words) const;
  };

  Matcher matcher_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<std::int32_t> end_tokens_;
  std::vector<StackSet> states_;                       // state id -> its stack set
  std::vector<std::array<StateId, 256>> moves_;        // state id -> byte -> state id
  std::unordered_map<std::vector<std::uint32_t>, StateId, WordsHash> state_ids_;
  StackSet next_;                                      // a move's result before it is interned
  std::vector<StateId> levels_;  // (trie depth + 1): the state after each prefix of the walk
  std::unordered_map<StateId, std::vector<std::uint32_t>> cache_;  // start state -> its mask
  std::uint64_t walked_ = 0, cached_ = 0;
};

}  // namespace mqlm::model::grammar
