// The one compute queue: a step's work is recorded into one command buffer (a Recording) and
// submitted once; each submission signals the next value of a timeline semaphore, so "is the
// work of submission v done" is completed() >= v, and the pool fences freed memory with it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
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

 private:
  friend class ComputeQueue;
  Recording(ComputeQueue& queue, std::size_t slot, VkCommandBuffer command_buffer);
  void barrier_if_needed();

  ComputeQueue* queue_;
  std::size_t slot_;
  VkCommandBuffer command_buffer_;
  bool has_commands_ = false;
  bool skip_barrier_ = false;
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

 private:
  friend class Recording;
  struct Slot {
    VkCommandBuffer command_buffer;
    std::uint64_t value;  // the submission that last used it
    bool recording;
  };
  void drop(std::size_t slot);
  void block_until(std::uint64_t value) const;

  const Device& device_;
  UniqueCommandPool pool_;
  UniqueSemaphore timeline_;
  std::vector<Slot> slots_;
  std::uint64_t last_submitted_ = 0;
  std::uint64_t open_recordings_ = 0;
};

}  // namespace mqlm::gpu
