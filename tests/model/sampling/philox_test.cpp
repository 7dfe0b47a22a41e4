#include "model/sampling/philox.hpp"

#include <gtest/gtest.h>

namespace mqlm::model {
namespace {

// Random123's known answers for philox4x32 with 10 rounds (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The same generator at compile time: the GPU's table tests can share expected values.
static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5);

TEST(Philox, UniformIsTheTop24BitsOfTheFirstWord) {
  EXPECT_EQ(uniform_for(0, 0), static_cast<float>(0x6627e8d5u >> 8) * 0x1.0p-24f);
  // The seed's low word is key 0 and its high word key 1; the index is counter word 0.
  std::uint64_t seed = 0x299f31d0a4093822ull;
  auto words = philox4x32_10({0x243f6a88, 0, 0, 0}, {0xa4093822, 0x299f31d0});
  EXPECT_EQ(uniform_for(seed, 0x243f6a88), static_cast<float>(words[0] >> 8) * 0x1.0p-24f);
}

TEST(Philox, UniformStaysInTheUnitIntervalAndVariesWithIndexAndSeed) {
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float u = uniform_for(12345, static_cast<std::uint32_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // the mean's standard deviation is 0.0009
  EXPECT_NE(uniform_for(1, 0), uniform_for(2, 0));
  EXPECT_NE(uniform_for(1ull << 32, 0), uniform_for(0, 0));
}

}  // namespace
}  // namespace mqlm::model
