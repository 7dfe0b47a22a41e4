// Many sequences' allowed-token masks at once. A step's constrained rows each need their
// TokenConstraint::allowed(); a walk over a 128k vocabulary inside a JSON string takes up to a few
// milliseconds (H200's host: 0.47 ms mean, 3.6 ms p99), so 32 rows one after another take longer
// than the GPU's whole step. The walks are independent (each constraint is touched by one thread;
// they share only the read-only grammar and token trie), so a few threads of our own share them
// with the caller.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "model/grammar/token_mask.hpp"

namespace mqlm::model::grammar {

class MaskWorkers {
 public:
  // `threads` beside the caller's; 0: the caller walks every mask itself.
  explicit MaskWorkers(unsigned threads);
  ~MaskWorkers();
  MaskWorkers(const MaskWorkers&) = delete;
  MaskWorkers& operator=(const MaskWorkers&) = delete;

  // Each constraint's allowed(), in order, each valid until that constraint's next call. Returns
  // when every one is done; an exception from one is rethrown here (the first, after the rest).
  std::vector<std::span<const std::uint32_t>> allowed(std::span<TokenConstraint* const> constraints);

  unsigned threads() const { return static_cast<unsigned>(threads_.size()); }

  // The default beside an executor: half the machine's cores, at most 8 (a 2-core machine: 1).
  static unsigned default_threads();

 private:
  void work_loop();
  void take_items();

  std::mutex mutex_;
  std::condition_variable wake_;      // workers: a job, or stopping
  std::condition_variable finished_;  // the caller: every item done and every worker out of the job
  std::uint64_t generation_ = 0;      // which job; workers join a job once
  bool stopping_ = false;
  unsigned active_ = 0;               // workers inside the current job
  // The current job (set by the caller before generation_ moves on, under the mutex).
  std::span<TokenConstraint* const> job_;
  std::vector<std::span<const std::uint32_t>>* out_ = nullptr;
  std::atomic<std::size_t> next_{0};
  std::size_t done_ = 0;
  std::exception_ptr failure_;
  std::vector<std::jthread> threads_;  // last: started after the rest is ready, joined first
};

}  // namespace mqlm::model::grammar
