// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC 2011), as cuRAND and Random123 define it. A draw is a pure function of (key,
// counter): the CPU sampler and the GPU kernel (shaders/sample.comp) compute the same number for a
// request's seed and token index without sharing any state, whatever the batching.
#pragma once

#include <array>
#include <cstdint>

namespace mqlm::model {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

// The four output words for one counter and key: ten rounds, the key bumped between rounds.
constexpr PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  constexpr std::uint64_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t kBump0 = 0x9E3779B9u, kBump1 = 0xBB67AE85u;  // golden ratio, sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kBump0;
      key[1] += kBump1;
    }
    std::uint64_t product0 = kMultiplier0 * counter[0];
    std::uint64_t product1 = kMultiplier1 * counter[2];
    auto hi0 = static_cast<std::uint32_t>(product0 >> 32), lo0 = static_cast<std::uint32_t>(product0);
    auto hi1 = static_cast<std::uint32_t>(product1 >> 32), lo1 = static_cast<std::uint32_t>(product1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
  }
  return counter;
}

// The uniform number in [0, 1) of a request's index-th generated token: 24 bits, so it is exact in
// float and in double and the GPU's float draw and the CPU's double one compare the same target.
constexpr float uniform_for(std::uint64_t seed, std::uint32_t index) {
  PhiloxKey key = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  PhiloxCounter words = philox4x32_10({index, 0, 0, 0}, key);
  return static_cast<float>(words[0] >> 8) * 0x1.0p-24f;
}

}  // namespace mqlm::model
