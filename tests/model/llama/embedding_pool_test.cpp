// model::EmbeddingPool: mean and last pooling over the chunks a prompt is computed in.
#include <gtest/gtest.h>

#include <vector>

#include "model/llama/embedding_pool.hpp"

namespace mqlm::model {
namespace {

TEST(EmbeddingPool, MeanOverChunksIsTheNormalisedSum) {
  EmbeddingPool pool(Pooling::mean, 2);
  EXPECT_TRUE(pool.vector().empty());
  ASSERT_TRUE(pool.add(std::vector<float>{1, 0, 2, 0}, 0));  // positions 0 and 1
  ASSERT_TRUE(pool.add(std::vector<float>{0, 4}, 2));
  EXPECT_EQ(pool.positions(), 3u);
  const std::vector<float> v = pool.vector();  // (3, 4) / 5
  ASSERT_EQ(v.size(), 2u);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], 0.8f);
}

TEST(EmbeddingPool, LastTakesTheLastRowOfTheLastChunk) {
  EmbeddingPool pool(Pooling::last, 2);
  ASSERT_TRUE(pool.add(std::vector<float>{9, 9, 3, 4}, 0));
  EXPECT_FLOAT_EQ(pool.vector()[0], 0.6f);
  ASSERT_TRUE(pool.add(std::vector<float>{0, -2}, 2));
  EXPECT_FLOAT_EQ(pool.vector()[0], 0.0f);
  EXPECT_FLOAT_EQ(pool.vector()[1], -1.0f);
}

TEST(EmbeddingPool, PositionZeroStartsOverAndAGapIsRefused) {
  EmbeddingPool pool(Pooling::mean, 2);
  ASSERT_TRUE(pool.add(std::vector<float>{5, 0, 5, 0}, 0));
  EXPECT_FALSE(pool.add(std::vector<float>{0, 1}, 3)) << "position 2 comes next";
  EXPECT_FALSE(pool.add(std::vector<float>{0, 1, 2}, 2)) << "not whole rows";
  EXPECT_EQ(pool.positions(), 2u);
  ASSERT_TRUE(pool.add(std::vector<float>{0, 1}, 0));  // recomputed after a preemption
  EXPECT_EQ(pool.positions(), 1u);
  EXPECT_FLOAT_EQ(pool.vector()[1], 1.0f);
}

}  // namespace
}  // namespace mqlm::model
