// An embedding pooled from a sequence's final hidden states (after output_norm), as llama.cpp's
// pooling types mean and last do it, over the chunks its prompt is computed in.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mqlm::model {

enum class Pooling : std::uint8_t {
  none = 0,  // not an embedding: the sequence generates
  mean = 1,  // the mean over every position of the prompt
  last = 2,  // the last position's state
};

class EmbeddingPool {
 public:
  EmbeddingPool(Pooling pooling, std::uint32_t width) : pooling_(pooling), sum_(width, 0.0) {}

  // A chunk's rows (rows.size() / width of them) for positions position, position + 1, ...: the
  // chunks of one computation come in order; one at position 0 starts over (the sequence was
  // preempted and is computed again). False, changing nothing, for a chunk that does not continue
  // the ones before or is not whole rows.
  bool add(std::span<const float> rows, std::uint32_t position);
  // The pooled vector, L2-normalised (as vLLM and llama-server answer by default); empty before
  // any row.
  std::vector<float> vector() const;
  std::uint32_t positions() const { return positions_; }

 private:
  Pooling pooling_;
  std::vector<double> sum_;  // (width) mean: the rows' sum; last: the last row
  std::uint32_t positions_ = 0;
};

}  // namespace mqlm::model
