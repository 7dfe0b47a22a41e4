#include "model/grammar/mask_workers.hpp"

#include <algorithm>
#include <utility>

namespace mqlm::model::grammar {

MaskWorkers::MaskWorkers(unsigned threads) {
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { work_loop(); });
}

MaskWorkers::~MaskWorkers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  threads_.clear();  // joins
}

unsigned MaskWorkers::default_threads() {
  return std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u);
}

// Takes items of the current job until none is left; each result goes to its own slot.
void MaskWorkers::take_items() {
  std::size_t finished = 0;
  std::exception_ptr failed;
  for (std::size_t i = next_.fetch_add(1); i < job_.size(); i = next_.fetch_add(1)) {
    try {
      (*out_)[i] = job_[i]->allowed();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
    ++finished;
  }
  std::lock_guard lock(mutex_);
  done_ += finished;
  if (failed && !failure_) failure_ = failed;
}

void MaskWorkers::work_loop() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    ++active_;
    lock.unlock();
    take_items();
    lock.lock();
    --active_;
    finished_.notify_one();
  }
}

std::vector<std::span<const std::uint32_t>> MaskWorkers::allowed(std::span<TokenConstraint* const> constraints) {
  std::vector<std::span<const std::uint32_t>> out(constraints.size());
  if (constraints.empty()) return out;
  if (threads_.empty() || constraints.size() == 1) {
    for (std::size_t i = 0; i < constraints.size(); ++i) out[i] = constraints[i]->allowed();
    return out;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = constraints;
    out_ = &out;
    next_.store(0);
    done_ = 0;
    failure_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  take_items();
  std::unique_lock lock(mutex_);
  // Every item done, and no worker still inside this job (one that woke late finds nothing left,
  // but must be out before the job's fields are set for the next call).
  finished_.wait(lock, [&] { return done_ == constraints.size() && active_ == 0; });
  job_ = {};
  out_ = nullptr;
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  return out;
}

}  // namespace mqlm::model::grammar
