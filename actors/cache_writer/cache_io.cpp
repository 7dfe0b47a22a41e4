#include "actors/cache_writer/cache_io.hpp"

#include <spdlog/spdlog.h>

namespace mqlm::actors {

CacheIo::CacheIo(CacheIoOptions options, zmq::context_t& context, const std::string& notify)
    : options_(std::move(options)), store_(options_.directory, options_.max_bytes) {
  ssd_bytes_ = store_.bytes();
  ssd_pages_ = static_cast<std::uint32_t>(store_.pages());
  spdlog::info("cache-writer: SSD tier {}: {} pages, {} of {} bytes", options_.directory.string(), ssd_pages_,
               ssd_bytes_, options_.max_bytes);
  thread_ = std::thread([this, &context, notify] { run(context, notify); });
}

CacheIo::~CacheIo() { stop(false); }

void CacheIo::write(WriteJob job) {
  std::lock_guard lock(mutex_);
  writes_.emplace_back(std::move(job));
  wake_.notify_one();
}

void CacheIo::read(ReadJob job) {
  std::lock_guard lock(mutex_);
  urgent_.emplace_back(std::move(job));
  wake_.notify_one();
}

void CacheIo::clear(ClearJob job) {
  std::lock_guard lock(mutex_);
  urgent_.emplace_back(job);
  wake_.notify_one();
}

void CacheIo::barrier(BarrierJob job) {
  std::lock_guard lock(mutex_);
  writes_.emplace_back(job);
  wake_.notify_one();
}

std::uint32_t CacheIo::drop_writes(const std::optional<std::string>& model) {
  std::deque<std::variant<WriteJob, BarrierJob>> dropped;  // released outside the lock
  std::uint32_t count = 0;
  {
    std::lock_guard lock(mutex_);
    std::erase_if(writes_, [&](auto& job) {
      auto* write = std::get_if<WriteJob>(&job);
      if (write == nullptr || (model && write->page.model != *model)) return false;
      dropped.emplace_back(std::move(*write));
      ++count;
      return true;
    });
  }
  return count;
}

std::vector<IoResult> CacheIo::take_results() {
  std::lock_guard lock(mutex_);
  return std::exchange(results_, {});
}

void CacheIo::stop(bool finish_writes) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    finish_writes_ = finish_writes;
    if (!finish_writes) writes_.clear();
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

std::uint64_t CacheIo::ssd_bytes() const {
  std::lock_guard lock(mutex_);
  return ssd_bytes_;
}

std::uint32_t CacheIo::ssd_pages() const {
  std::lock_guard lock(mutex_);
  return ssd_pages_;
}

void CacheIo::run(zmq::context_t& context, std::string notify) {
  zmq::socket_t signal(context, zmq::socket_type::pair);
  signal.set(zmq::sockopt::linger, 0);
  signal.connect(notify);
  for (;;) {
    std::variant<std::monostate, ReadJob, ClearJob, WriteJob, BarrierJob> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !urgent_.empty() || !writes_.empty(); });
      if (!urgent_.empty()) {
        std::visit([&](auto& j) { job = std::move(j); }, urgent_.front());
        urgent_.pop_front();
      } else if (!writes_.empty() && (!stopping_ || finish_writes_)) {
        std::visit([&](auto& j) { job = std::move(j); }, writes_.front());
        writes_.pop_front();
      } else if (stopping_) {
        writes_.clear();
        return;
      }
    }
    if (std::holds_alternative<std::monostate>(job)) continue;
    IoResult result = std::visit(
        [&](auto& j) -> IoResult {
          if constexpr (std::is_same_v<std::decay_t<decltype(j)>, std::monostate>) {
            return {};
          } else {
            return handle(j);
          }
        },
        job);
    job = std::monostate{};  // a written page's frame goes now, not with the next job
    result.ssd_bytes = store_.bytes();
    result.ssd_pages = static_cast<std::uint32_t>(store_.pages());
    {
      std::lock_guard lock(mutex_);
      ssd_bytes_ = result.ssd_bytes;
      ssd_pages_ = result.ssd_pages;
      results_.push_back(std::move(result));
    }
    // One byte says "results"; if the actor has not read the last ones yet, it will read these too.
    signal.send(zmq::const_buffer("r", 1), zmq::send_flags::dontwait);
  }
}

IoResult CacheIo::handle(WriteJob& job) {
  WriteDone done{job.page.key, job.page.model, false, {}};
  if (options_.fail_writes) {
    done.error = "injected write failure (fail_writes): as if the disk were full";
  } else {
    const auto* bytes = static_cast<const std::byte*>(job.data.data());
    SsdStore::WriteResult written = store_.write(job.page, {bytes, job.data.size()});
    done.ok = written.ok;
    done.error = std::move(written.error);
  }
  return {std::move(done)};
}

IoResult CacheIo::handle(ReadJob& job) {
  // Eight files at a time: on the H200 machine's disk one reader took 1.7 s for 499 pages of 2 MiB.
  return {ReadDone{job.lookup, store_.read_run(job.keys, 8)}};
}

IoResult CacheIo::handle(ClearJob& job) {
  ClearDone done{job.id, 0, static_cast<std::uint32_t>(store_.pages()), {}};
  try {
    done.bytes = store_.clear();
  } catch (const std::exception& e) {
    done.error = e.what();
  }
  return {std::move(done)};
}

IoResult CacheIo::handle(BarrierJob& job) { return {BarrierDone{job.id}}; }

}  // namespace mqlm::actors
