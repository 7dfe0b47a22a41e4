// KV pages in and out of a model's cache, as plans ask for the prefix cache's tiers: the pages a
// plan gives up go to the cache-writer (spills), and the pages it restores are written from the
// blobs it came with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "gpu/buffer_pool.hpp"
#include "gpu/compute_queue.hpp"
#include "gpu/transfer.hpp"
#include "messages/catalog.hpp"
#include "messages/codec.hpp"
#include "model/llama/gpu_model.hpp"

namespace mqlm::actors {

// A spill travels in pieces, each with its staging buffer and its message; moving a plan's pages
// waits for nothing on the host: the GPU copies spilled pages into staging ahead of the step that
// overwrites them, and a helper thread copies staging into the message once the queue has passed
// it, which goes at a later step boundary (advance) or on the timer.
class KvPageMoves {
 public:
  // cache_writer: where spills go ("": nowhere; the plan's spills are dropped). spill_piece_pages:
  // the pages of one piece at most (0: half a pool block's worth). timer_id: the executor's timer
  // that advances the spills when no step comes to do it.
  KvPageMoves(std::string cache_writer, std::uint64_t spill_piece_pages, std::uint32_t timer_id);

  // The plan's spills start on their way (ahead of its restores and of its step, which wait for
  // them on the GPU), then its restores are written from `blobs`, one page each. Throws what the
  // cache throws; the plan has been checked against the cache's pages.
  void move(const messages::StepPlan& plan, const messages::Frames& blobs, const std::string& model_id,
            model::GpuKvCache& cache, const gpu::BufferPool& pool);

  // Moves spills along, oldest first: starts the host's copy of each whose GPU copy is done, sends
  // each whose host copy is done to the cache-writer. With `wait`, waits for all of them (before a
  // model's cache goes, a full trim, the actor's stop); otherwise the timer comes back while any
  // is left. A GPU failure drops the spills whose copy had not finished: the scheduler's later
  // lookups of those pages miss, and the prompt is computed again.
  void advance(Context& ctx, gpu::ComputeQueue& queue, bool wait);
  // The timer went off: the next advance that leaves spills behind sets it again.
  void timer_fired() { timer_set_ = false; }

  // The device is lost: spills it had not copied are lost, and every staging buffer goes back to
  // the pool before the pool goes.
  void drop_all();
  // The staging kept for later spills goes back to the pool (a full trim).
  void release_kept_staging() { kept_staging_.clear(); }

 private:
  // A page's bytes on the host, left uninitialised: the copy out of staging writes every byte, and
  // zeroing them first (a std::vector) took half of a long prefix's restore on the H200, on one
  // thread, where the copy touches the fresh memory on several.
  struct HostPage {
    std::unique_ptr<std::byte[]> bytes;
    std::size_t count = 0;
    std::byte* data() { return bytes.get(); }
    const std::byte* data() const { return bytes.get(); }
    std::size_t size() const { return count; }
  };
  // One piece of a spill, on its way to the cache-writer. Until it is sent it owns the staging
  // buffer, the pages, and the thread (a future joins it when destroyed).
  struct PendingSpill {
    gpu::PendingDownload download;
    std::vector<std::shared_ptr<HostPage>> pages;
    messages::KvPagesSpilled message;
    std::future<void> copying;  // valid once the copy out of staging has begun
  };

  // Returns how long it spent allocating host memory and recording the copies, in ms.
  std::pair<double, double> spill(const messages::StepPlan& plan, const std::string& model_id,
                                  model::GpuKvCache& cache, const gpu::BufferPool& pool);
  gpu::PoolBuffer take_staging(std::uint64_t bytes);
  void keep_staging(gpu::PoolBuffer staging);
  void send_front(Context& ctx);

  std::string cache_writer_;
  std::uint64_t spill_piece_pages_ = 0;
  std::uint32_t timer_id_ = 0;
  bool timer_set_ = false;
  std::deque<PendingSpill> spills_;  // in the order the queue copies them
  // Host staging of spills whose copies are done, kept for the next ones (at most kKeptStaging):
  // taking it from the pool again may have the pool take a block from the driver, which for
  // pinned host memory costs ~0.3 ms a MiB. A full trim lets it go.
  std::vector<gpu::PoolBuffer> kept_staging_;
};

}  // namespace mqlm::actors
