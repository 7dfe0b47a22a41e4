// The allowed-token mask: the trie walk against the matcher token by token, the end tokens, and
// the cache.
#include "model/grammar/token_mask.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/grammar/json_schema.hpp"

namespace mqlm::model::grammar {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> compiled(const json& schema) {
  return std::get<std::shared_ptr<const Grammar>>(compile_json_schema(schema, false));
}

// A vocabulary with JSON's punctuation, words, pieces that span structure, multi-byte UTF-8 cut
// in the middle, duplicates, and two control tokens (empty pieces): 0 and 1.
std::vector<std::string> vocabulary() {
  std::vector<std::string> pieces = {"", ""};
  for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
  for (const char* p : {"{\"", "\":", "\",", "\"}", "}", "{}", "[]", "[\"", "true", "false", "null", "nu", "ll",
                        "name", "\"name\"", "\": \"", "12", "3.5", "e+", " ", "  ", "\n", "\n  ", "\n\n", "\xc3",
                        "\xa9", "\xc3\xa9", "\xe2\x82", "\xac\"", "\"\xc3\xa9\"", "\"}\n", "}}", "\"a", "a\"", "ann"}) {
    pieces.emplace_back(p);
  }
  pieces.emplace_back("name");  // a duplicate piece: both ids allowed alike
  return pieces;
}

bool bit(std::span<const std::uint32_t> mask, std::size_t token) { return ((mask[token / 32] >> (token % 32)) & 1u) != 0; }

// Every token's bit equals whether the matcher takes its piece (end tokens: whether it may end).
void expect_mask_matches_matcher(TokenConstraint& constraint, const std::shared_ptr<const Grammar>& grammar,
                                 const std::string& so_far, const TokenTrie& trie) {
  std::span<const std::uint32_t> mask = constraint.allowed();
  Matcher reference(grammar);
  ASSERT_TRUE(reference.advance(so_far));
  for (std::size_t t = 0; t < trie.size(); ++t) {
    bool expected;
    if (t == 0) {
      expected = reference.can_end();  // token 0 is the end token
    } else if (reference.must_end() || trie.piece(static_cast<std::int32_t>(t)).empty()) {
      expected = false;
    } else {
      Matcher copy = reference;
      expected = copy.advance(trie.piece(static_cast<std::int32_t>(t)));
    }
    ASSERT_EQ(bit(mask, t), expected) << "token " << t << " '" << trie.piece(static_cast<std::int32_t>(t))
                                      << "' after '" << so_far << "'";
  }
}

TEST(TokenMask, EqualsTheMatcherTokenByTokenAlongRandomValidTexts) {
  auto trie = std::make_shared<const TokenTrie>(vocabulary());
  const json schema = json::parse(R"({"type":"object","properties":{"name":{"type":"string"},
      "n":{"type":"number"},"ok":{"type":["boolean","null"]},"list":{"type":"array","items":{"type":"string"}}},
      "required":["name","ok"]})");
  auto grammar = compiled(schema);
  for (std::uint32_t seed = 0; seed < 6; ++seed) {
    std::mt19937 random(seed);
    TokenConstraint constraint(grammar, trie, {0});
    std::string so_far;
    for (int step = 0; step < 200; ++step) {
      expect_mask_matches_matcher(constraint, grammar, so_far, *trie);
      std::span<const std::uint32_t> mask = constraint.allowed();
      std::vector<std::int32_t> allowed;
      for (std::size_t t = 0; t < trie->size(); ++t)
        if (bit(mask, t)) allowed.push_back(static_cast<std::int32_t>(t));
      ASSERT_FALSE(allowed.empty()) << "no token allowed after '" << so_far << "'";
      // Biased toward closing quotes and braces so that texts finish.
      std::int32_t token = allowed[random() % allowed.size()];
      for (std::int32_t t : allowed) {
        const std::string& p = trie->piece(t);
        if ((p == "\"" || p == "}" || p == "]" || p == "\"}" || t == 0) && random() % 3 == 0) token = t;
      }
      if (token == 0) {
        EXPECT_TRUE(constraint.accept(0));
        break;
      }
      ASSERT_TRUE(constraint.accept(token));
      so_far += trie->piece(token);
    }
  }
}

TEST(TokenMask, TheEndTokenIsForcedOnceTheValueIsComplete) {
  auto trie = std::make_shared<const TokenTrie>(vocabulary());
  TokenConstraint constraint(compiled(json{{"type", "object"}}), trie, {0});
  std::span<const std::uint32_t> first = constraint.allowed();
  EXPECT_FALSE(bit(first, 0));
  EXPECT_TRUE(bit(first, 2 + '{'));
  EXPECT_FALSE(bit(first, 2 + ' '));  // no whitespace before the value
  EXPECT_FALSE(constraint.accept(0));
  ASSERT_TRUE(constraint.accept(2 + '{'));
  ASSERT_TRUE(constraint.accept(2 + '}'));
  EXPECT_TRUE(constraint.complete());
  std::span<const std::uint32_t> last = constraint.allowed();
  for (std::size_t t = 0; t < trie->size(); ++t) EXPECT_EQ(bit(last, t), t == 0) << t;
  EXPECT_FALSE(constraint.accept(2 + ' '));
}

TEST(TokenMask, MasksAreCachedByState) {
  auto trie = std::make_shared<const TokenTrie>(vocabulary());
  TokenConstraint constraint(compiled(json{{"type", "string"}}), trie, {0});
  constraint.allowed();
  ASSERT_TRUE(constraint.accept(2 + '"'));
  for (char c : std::string("abcdefgh")) {
    constraint.allowed();
    ASSERT_TRUE(constraint.accept(2 + static_cast<unsigned char>(c)));
  }
  EXPECT_EQ(constraint.masks_walked(), 2u);  // before the quote, and inside the string
  EXPECT_EQ(constraint.masks_cached(), 7u);
}

TEST(TokenTrie, KeepsEveryNonEmptyPieceOnce) {
  TokenTrie trie({"", "ab", "a", "abc", "b", "ab"});
  std::vector<std::int32_t> seen;
  for (const TokenTrie::Node& node : trie.nodes()) {
    for (std::int32_t t : trie.tokens(node)) seen.push_back(t);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(trie.node_count(), 4u);  // a, ab, abc, b
  EXPECT_EQ(trie.max_depth(), 3u);
  EXPECT_EQ(trie.nodes()[0].skip, 3u);  // a's subtree: a, ab, abc
}

}  // namespace
}  // namespace mqlm::model::grammar
