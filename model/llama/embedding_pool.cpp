#include "model/llama/embedding_pool.hpp"

#include <algorithm>
#include <cmath>

namespace mqlm::model {

bool EmbeddingPool::add(std::span<const float> rows, std::uint32_t position) {
  const std::size_t width = sum_.size();
  if (width == 0 || rows.empty() || rows.size() % width != 0 || (position != 0 && position != positions_)) return false;
  if (position == 0) {
    std::fill(sum_.begin(), sum_.end(), 0.0);
    positions_ = 0;
  }
  const std::size_t count = rows.size() / width;
  if (pooling_ == Pooling::last) {
    const std::span<const float> last = rows.subspan((count - 1) * width);
    std::copy(last.begin(), last.end(), sum_.begin());
  } else {
    for (std::size_t r = 0; r < count; ++r) {
      for (std::size_t i = 0; i < width; ++i) sum_[i] += rows[r * width + i];
    }
  }
  positions_ += static_cast<std::uint32_t>(count);
  return true;
}

std::vector<float> EmbeddingPool::vector() const {
  if (positions_ == 0) return {};
  // The mean's division goes with the normalisation: a vector's direction does not change with it.
  double norm = 0;
  for (double v : sum_) norm += v * v;
  norm = std::sqrt(norm);
  const double scale = norm > 0 ? 1.0 / norm : 0.0;
  std::vector<float> out(sum_.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(sum_[i] * scale);
  return out;
}

}  // namespace mqlm::model
