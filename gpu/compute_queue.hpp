// The one compute queue: a step's work is recorded into one command buffer (a Recording) and
// submitted once; each submission signals the next value of a timeline semaphore, so "is the
// work of submission v done" is completed() >= v, and the pool fences freed memory with it.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/device_handle.hpp"
#include "gpu/kernel_library.hpp"

namespace mqlm::gpu {

// A range of a VkBuffer that a kernel binds.
struct BufferRange {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize size = 0;
};

// Makes a submission wait until `semaphore` (a timeline semaphore) reaches `value`.
struct TimelineWait {
  VkSemaphore semaphore;
  std::uint64_t value;
};

class ComputeQueue;

// One step's command buffer, being recorded. Every dispatch and copy after the first is
// preceded by a full compute/transfer barrier, so commands run in the order recorded.
class Recording {
 public:
  Recording(Recording&& other) noexcept;
  Recording& operator=(Recording&&) = delete;
  Recording(const Recording&) = delete;
  ~Recording();  // a recording never submitted is dropped

  void dispatch(const Kernel& kernel, std::initializer_list<BufferRange> buffers, const void* push,
                std::uint32_t x, std::uint32_t y = 1, std::uint32_t z = 1);
  template <class Push>
  void dispatch(const Kernel& kernel, std::initializer_list<BufferRange> buffers, const Push& push, std::uint32_t x,
                std::uint32_t y = 1, std::uint32_t z = 1) {
    dispatch(kernel, buffers, static_cast<const void*>(&push), x, y, z);
  }
  void copy(BufferRange src, BufferRange dst);
  void fill(BufferRange dst, std::uint32_t value);  // every 32-bit word of dst (whole words)
  // data (whole words, at most 64 KiB) into dst, carried in the command buffer itself.
  void update(BufferRange dst, std::span<const std::byte> data);
  // The first command of this recording waits for the work submitted before it (a step split
  // into several submissions, so the host records the next part while the GPU runs this one).
  void after_previous_submissions() { has_commands_ = true; }
  // The next dispatch may run alongside the previous one: it neither reads what that one writes
  // nor writes what it reads or writes (q, k and v projections of the same input, say).
  void next_runs_alongside() { skip_barrier_ = true; }
  void write_timestamp(VkQueryPool pool, std::uint32_t query);
  // What the commands so far wrote becomes visible to the host once it has waited for this
  // submission (host-coherent memory alone does not make it so).
  void make_visible_to_host();
  VkCommandBuffer command_buffer() const { return command_buffer_; }
  // What the queue's timeline calls this submission where the GPU waited for it (a literal).
  void set_label(const char* label) { label_ = label; }

 private:
  friend class ComputeQueue;
  Recording(ComputeQueue& queue, std::size_t slot, VkCommandBuffer command_buffer);
  void barrier_if_needed();

  ComputeQueue* queue_;
  std::size_t slot_;
  VkCommandBuffer command_buffer_;
  bool has_commands_ = false;
  bool skip_barrier_ = false;
  const char* label_ = "";
};

// Where the GPU's time went, from a timestamp at the start and the end of every submission
// (ComputeQueue::enable_timeline): running them, or idle before one. An idle gap before a
// submission sent while the one before it still ran is the queue's own (submission and wake-up
// latency); before one sent after the GPU had drained, the host was late (starved), counted by
// the late submission's label. Gaps over idle_ms are no work at all, not counted.
struct QueueTimeline {
  static constexpr double idle_ms = 20.0;
  std::uint64_t submissions = 0;
  double busy_ms = 0;
  double queued_gap_ms = 0;
  double starved_ms = 0;
  std::map<std::string, double> starved_by_label;
  std::uint64_t starved_submissions = 0;
};

class ComputeQueue {
 public:
  explicit ComputeQueue(const Device& device);
  ~ComputeQueue();  // waits for every submission
  ComputeQueue(const ComputeQueue&) = delete;
  ComputeQueue& operator=(const ComputeQueue&) = delete;

  Recording begin();
  // Ends and submits the recording; returns the timeline value its completion signals.
  std::uint64_t submit(Recording& recording, std::span<const TimelineWait> waits = {});
  std::uint64_t submit_and_wait(Recording& recording);
  void wait(std::uint64_t value) const;  // throws GpuError on device loss
  void wait_idle() const { wait(last_submitted_); }
  std::uint64_t completed() const;
  std::uint64_t last_submitted() const { return last_submitted_; }
  // Memory freed now may still be read by submitted work and by recordings not yet submitted:
  // it is safe to reuse or release once completed() reaches this value.
  std::uint64_t free_fence() const { return last_submitted_ + open_recordings_; }
  const Device& device() const { return device_; }
  // Stamps every submission from now on (where the device has timestamps; not otherwise).
  void enable_timeline();
  // The stamped submissions' times so far, those completed read first.
  const QueueTimeline& timeline();

 private:
  friend class Recording;
  struct Slot {
    VkCommandBuffer command_buffer;
    std::uint64_t value;  // the submission that last used it
    bool recording;
  };
  struct Stamped {  // a submission whose stamps are not read yet
    std::uint64_t value;
    std::size_t slot;
    const char* label;
    bool starved;  // the GPU had finished everything before it when it was submitted
  };
  static constexpr std::size_t kStampedSlots = 256;
  void drop(std::size_t slot);
  void block_until(std::uint64_t value) const;
  void read_stamps();

  const Device& device_;
  UniqueCommandPool pool_;
  UniqueSemaphore timeline_;
  std::vector<Slot> slots_;
  std::uint64_t last_submitted_ = 0;
  std::uint64_t open_recordings_ = 0;
  UniqueQueryPool stamps_;  // two per slot (start, end), once enable_timeline is called
  double tick_ms_ = 0;
  std::deque<Stamped> stamped_;
  std::uint64_t last_end_tick_ = 0;
  QueueTimeline timeline_totals_;
};

}  // namespace mqlm::gpu
