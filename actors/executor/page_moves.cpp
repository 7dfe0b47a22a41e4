#include "actors/executor/page_moves.hpp"

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

#include <spdlog/spdlog.h>

namespace mqlm::actors {

using namespace messages;

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kSpillPoll = std::chrono::milliseconds(2);
constexpr std::size_t kKeptStaging = 4;

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

KvPageMoves::KvPageMoves(std::string cache_writer, std::uint64_t spill_piece_pages, std::uint32_t timer_id)
    : cache_writer_(std::move(cache_writer)), spill_piece_pages_(spill_piece_pages), timer_id_(timer_id) {}

void KvPageMoves::move(const StepPlan& plan, const Frames& blobs, const std::string& model_id, model::GpuKvCache& cache,
                       const gpu::BufferPool& pool) {
  double allocate_ms = 0, read_ms = 0, write_ms = 0;
  if (!plan.spill.empty() && !cache_writer_.empty()) std::tie(allocate_ms, read_ms) = spill(plan, model_id, cache, pool);
  if (!plan.restore.empty()) {
    std::vector<std::span<const std::byte>> data;
    for (const zmq::message_t& blob : blobs) data.emplace_back(static_cast<const std::byte*>(blob.data()), blob.size());
    const auto writing = Clock::now();
    cache.write_pages(plan.restore, data);
    write_ms = ms_since(writing);
  }
  // Where a long prefix's restore goes (the figures behind bench/results/prefix-cache-*).
  const std::size_t moved = plan.spill.size() + plan.restore.size();
  if (moved >= 64 || spdlog::should_log(spdlog::level::debug)) {
    spdlog::log(moved >= 64 ? spdlog::level::info : spdlog::level::debug,
                "executor: {} pages out ({:.1f} ms allocating host memory, {:.1f} ms recording the copy), {} pages in ({:.1f} ms), "
                "{:.1f} MiB each way at most",
                plan.spill.size(), allocate_ms, read_ms, plan.restore.size(), write_ms,
                mib(std::max(plan.spill.size(), plan.restore.size()) * cache.page_bytes()));
  }
}

// In pieces of at most half a pool block, each with its own staging and message: a larger staging
// buffer is a block of its own, which the pool takes from the driver for each spill (H100,
// 254-284 MiB of pinned host memory: 100-190 ms the executor stood still) where pieces are carved
// from the blocks it keeps.
std::pair<double, double> KvPageMoves::spill(const StepPlan& plan, const std::string& model_id,
                                             model::GpuKvCache& cache, const gpu::BufferPool& pool) {
  const std::uint64_t page_bytes = cache.page_bytes();
  const std::size_t per_piece =
      spill_piece_pages_ > 0 ? spill_piece_pages_ : std::max<std::uint64_t>(1, pool.block_size() / 2 / page_bytes);
  double allocate_ms = 0, read_ms = 0;
  for (std::size_t first = 0; first < plan.spill.size(); first += per_piece) {
    const auto piece_start = Clock::now();
    PendingSpill piece;
    std::vector<std::uint32_t> pages;
    std::vector<std::span<std::byte>> out;
    piece.message = KvPagesSpilled{model_id, plan.model_key, cache.page_size(), page_bytes, {}};
    for (std::size_t i = first; i < std::min(first + per_piece, plan.spill.size()); ++i) {
      const SpillPage& page = plan.spill[i];
      pages.push_back(page.page);
      piece.pages.push_back(std::make_shared<HostPage>(std::make_unique_for_overwrite<std::byte[]>(page_bytes), page_bytes));
      out.emplace_back(piece.pages.back()->data(), page_bytes);
      piece.message.pages.push_back(page.id);
    }
    gpu::PoolBuffer staging = take_staging(pages.size() * page_bytes);
    const auto recording = Clock::now();
    allocate_ms += std::chrono::duration<double, std::milli>(recording - piece_start).count();
    // Ahead of the restores and of the step: both wait for it on the GPU, not here.
    piece.download = cache.read_pages_later(pages, out, std::move(staging));
    read_ms += ms_since(recording);
    spills_.push_back(std::move(piece));
  }
  return {allocate_ms, read_ms};
}

// The smallest kept staging that holds `bytes`, out of the list; empty where none does (the cache
// then takes staging from the pool).
gpu::PoolBuffer KvPageMoves::take_staging(std::uint64_t bytes) {
  auto best = kept_staging_.end();
  for (auto it = kept_staging_.begin(); it != kept_staging_.end(); ++it) {
    if (it->size() >= bytes && (best == kept_staging_.end() || it->size() < best->size())) best = it;
  }
  if (best == kept_staging_.end()) return {};
  gpu::PoolBuffer staging = std::move(*best);
  kept_staging_.erase(best);
  return staging;
}

// Kept for the next spills: the largest ones, which the pool is slowest to give again.
void KvPageMoves::keep_staging(gpu::PoolBuffer staging) {
  if (!staging || staging.mapped() == nullptr) return;
  kept_staging_.push_back(std::move(staging));
  if (kept_staging_.size() > kKeptStaging) {
    kept_staging_.erase(std::ranges::min_element(kept_staging_, {}, &gpu::PoolBuffer::size));
  }
}

void KvPageMoves::advance(Context& ctx, gpu::ComputeQueue& queue, bool wait) {
  if (spills_.empty()) return;
  for (PendingSpill& piece : spills_) {
    if (piece.copying.valid()) continue;
    try {
      if (wait) queue.wait(piece.download.done);
      if (queue.completed() < piece.download.done) break;  // the later ones are behind it
    } catch (const std::exception& e) {
      spdlog::error("executor: {} KV pages spilled to the host are lost: {}", spills_.size(), e.what());
      spills_.clear();
      return;
    }
    // The entry stays where it is (a deque moves nothing on push_back or pop_front) until the
    // future, destroyed first, has joined the thread.
    piece.copying = std::async(std::launch::async, [download = &piece.download] { download->copy_out(); });
  }
  while (!spills_.empty() && spills_.front().copying.valid() &&
         (wait || spills_.front().copying.wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
    send_front(ctx);
  }
  if (!spills_.empty() && !timer_set_) {
    timer_set_ = true;
    ctx.set_timer(timer_id_, kSpillPoll, false);
  }
}

// The oldest spill, its host copy done (or waited for), goes to the cache-writer.
void KvPageMoves::send_front(Context& ctx) {
  PendingSpill& piece = spills_.front();
  piece.copying.get();
  keep_staging(std::move(piece.download.staging));
  Frames frames;
  for (std::shared_ptr<HostPage>& page : piece.pages) frames.push_back(shared_frame(std::shared_ptr<const HostPage>(std::move(page))));
  ctx.send(cache_writer_, std::move(piece.message), {0, 0, std::move(frames)});
  spills_.pop_front();
}

void KvPageMoves::drop_all() {
  spills_.clear();
  kept_staging_.clear();
}

}  // namespace mqlm::actors
