// MaskWorkers gives each constraint the mask its own allowed() gives, with several threads at
// once, step after step, as the executor asks for a step's constrained rows.
#include "model/grammar/mask_workers.hpp"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/gguf/synthetic_vocabulary.hpp"
#include "model/grammar/response_grammar.hpp"

namespace mqlm::model::grammar {
namespace {

bool bit(std::span<const std::uint32_t> mask, std::size_t t) { return ((mask[t / 32] >> (t % 32)) & 1u) != 0; }

TEST(MaskWorkers, EachConstraintGetsTheMaskItsOwnWalkGivesStepAfterStep) {
  const auto tokenizer = std::get<Tokenizer>(Tokenizer::create(gguf::make_byte_bpe_vocabulary(4096)));
  const auto trie = std::make_shared<const TokenTrie>(token_pieces(tokenizer));
  const ResponseFormat format{static_cast<std::uint8_t>(ResponseKind::json_schema),
                              R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"string",)"
                              R"("maxLength":8},"minItems":3},"n":{"type":"integer"}},"required":["a","n"]})",
                              true};
  const auto grammar = std::get<std::shared_ptr<const Grammar>>(response_grammar(format));
  constexpr std::size_t kRows = 24;
  // Two constraints per row walking the same tokens: one asked through the workers, one alone.
  std::vector<TokenConstraint> pooled, alone;
  for (std::size_t r = 0; r < kRows; ++r) {
    pooled.emplace_back(grammar, trie, std::vector<std::int32_t>{tokenizer.eos()});
    alone.emplace_back(grammar, trie, std::vector<std::int32_t>{tokenizer.eos()});
  }
  std::vector<TokenConstraint*> rows;
  for (TokenConstraint& c : pooled) rows.push_back(&c);
  MaskWorkers workers(3);
  ASSERT_EQ(workers.threads(), 3u);
  std::mt19937 random(7);
  std::size_t compared = 0;
  for (int step = 0; step < 30; ++step) {
    const std::vector<std::span<const std::uint32_t>> masks = workers.allowed(rows);
    ASSERT_EQ(masks.size(), kRows);
    for (std::size_t r = 0; r < kRows; ++r) {
      const std::span<const std::uint32_t> expected = alone[r].allowed();
      ASSERT_EQ(std::vector<std::uint32_t>(masks[r].begin(), masks[r].end()),
                std::vector<std::uint32_t>(expected.begin(), expected.end()))
          << "row " << r << ", step " << step;
      ++compared;
      std::vector<std::int32_t> allowed;
      for (std::size_t t = 0; t < trie->size(); ++t) {
        if (bit(expected, t) && static_cast<std::int32_t>(t) != tokenizer.eos()) allowed.push_back(static_cast<std::int32_t>(t));
      }
      if (allowed.empty()) continue;  // complete: only the end token is left
      const std::int32_t token = allowed[random() % allowed.size()];
      ASSERT_TRUE(pooled[r].accept(token));
      ASSERT_TRUE(alone[r].accept(token));
    }
  }
  EXPECT_EQ(compared, kRows * 30);
}

TEST(MaskWorkers, NoThreadsAndEmptyStepsWork) {
  const auto tokenizer = std::get<Tokenizer>(Tokenizer::create(gguf::make_byte_bpe_vocabulary(1024)));
  const auto trie = std::make_shared<const TokenTrie>(token_pieces(tokenizer));
  const auto grammar = std::get<std::shared_ptr<const Grammar>>(
      response_grammar({static_cast<std::uint8_t>(ResponseKind::json_object), "", false}));
  TokenConstraint c(grammar, trie, {tokenizer.eos()});
  TokenConstraint* row = &c;
  MaskWorkers alone(0);
  EXPECT_TRUE(alone.allowed({}).empty());
  const auto masks = alone.allowed(std::span(&row, 1));
  ASSERT_EQ(masks.size(), 1u);
  const std::span<const std::uint32_t> expected = c.allowed();
  EXPECT_EQ(std::vector<std::uint32_t>(masks[0].begin(), masks[0].end()),
            std::vector<std::uint32_t>(expected.begin(), expected.end()));
  EXPECT_TRUE(std::any_of(expected.begin(), expected.end(), [](std::uint32_t w) { return w != 0; }));
  MaskWorkers some(2);
  EXPECT_TRUE(some.allowed({}).empty());
}

}  // namespace
}  // namespace mqlm::model::grammar
