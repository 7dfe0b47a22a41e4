// All device memory goes through one BufferPool, which the executor owns (single-threaded).
// It sub-allocates from large VkDeviceMemory blocks; a freed range goes to a cache keyed by its
// size class (sizes are rounded up to classes 1/8 of a power of two apart) and is reused by the
// next allocation of that class once the GPU can no longer be reading it: each freed range
// carries the compute queue's free_fence() and is reusable only when completed() reaches it.
// trim() waits for in-flight work, returns every cached range to its block's free space and
// every wholly free block to the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/compute_queue.hpp"
#include "gpu/device_handle.hpp"
#include "gpu/vulkan_error.hpp"

namespace mqlm::gpu {

enum class MemoryKind : std::uint8_t {
  device,  // device-local: what kernels read and write
  host,    // host-visible and coherent: staging for uploads and readbacks
};

// The block size of a pool on a device whose largest device-local heap is device_local_bytes:
// 512 MiB from 32 GiB, else 256 MiB. On the H100, llama3-8b Q4_0 decoded at 310.0-312.8 tok/s from
// weights in 256 MiB blocks and at 315.3-317.0 from blocks of 512 MiB to 4 GiB (four runs each,
// bench/results/pool-blocks-2026-11-27-h100.md); a block is also what trim() may leave held.
VkDeviceSize default_block_size(std::uint64_t device_local_bytes);

struct PoolOptions {
  VkDeviceSize block_size = 0;  // 0: default_block_size; larger allocations get a block of their own
};

struct PoolStats {
  std::uint64_t active_bytes = 0;       // in live allocations (rounded to their size class)
  std::uint64_t cached_bytes = 0;       // freed, kept for reuse
  std::uint64_t pending_bytes = 0;      // part of cached_bytes the GPU may still be reading
  std::uint64_t peak_active_bytes = 0;  // since construction or reset_peak()
  std::uint64_t held_bytes = 0;         // allocated from the driver
  std::uint64_t blocks = 0;             // VkDeviceMemory allocations
  std::map<std::string, std::uint64_t, std::less<>> active_by_owner;  // owners with active bytes
};

struct TrimResult {
  std::uint64_t bytes_released = 0;
  std::uint64_t blocks_released = 0;
};

// The pool could not get memory from the driver even after trimming.
struct OutOfDeviceMemory : GpuError {
  using GpuError::GpuError;
};

class BufferPool;

// One allocation; returns its range to the pool when destroyed (the pool must outlive it).
class PoolBuffer {
 public:
  PoolBuffer() = default;
  PoolBuffer(PoolBuffer&& other) noexcept { *this = std::move(other); }
  PoolBuffer& operator=(PoolBuffer&& other) noexcept;
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  ~PoolBuffer() { reset(); }

  void reset();  // frees it now
  explicit operator bool() const { return pool_ != nullptr; }
  VkDeviceSize size() const { return size_; }  // as requested
  BufferRange range() const { return {buffer_, offset_, size_}; }
  BufferRange range(VkDeviceSize offset, VkDeviceSize size) const;  // a sub-range, checked
  std::byte* mapped() const { return mapped_; }  // null unless the memory is host-visible

 private:
  friend class BufferPool;
  BufferPool* pool_ = nullptr;
  std::uint32_t block_ = 0;
  std::uint32_t owner_ = 0;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceSize offset_ = 0;
  VkDeviceSize size_ = 0;
  VkDeviceSize class_size_ = 0;
  MemoryKind kind_ = MemoryKind::device;
  std::byte* mapped_ = nullptr;
};

class BufferPool {
 public:
  BufferPool(const ComputeQueue& queue, PoolOptions options = {});
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // `owner` names who holds it in the statistics: "weights:<model>", "kv", "scratch", ...
  PoolBuffer allocate(VkDeviceSize size, std::string_view owner, MemoryKind kind = MemoryKind::device);

  PoolStats stats() const;
  void reset_peak();
  // Waits for all submitted GPU work, then releases everything cached and every free block.
  // Ranges freed while a recording is still open stay cached (that recording may use them).
  TrimResult trim();
  // The same without waiting: releases only what completed work no longer needs.
  TrimResult trim_completed();
  // Every allocation stamps its block with the pool's epoch, which begin_epoch() advances.
  std::uint64_t epoch() const { return epoch_; }
  void begin_epoch() { ++epoch_; }
  // Waits like trim() and returns every cached range to its block, but gives the driver only the
  // wholly free blocks that no allocation has used since `epoch` began: the blocks recent work
  // used stay (its working set, however fragmented), the ones it stopped using go. trim() is this
  // with every epoch.
  TrimResult trim_unused_since(std::uint64_t epoch);

  VkDeviceSize size_class(VkDeviceSize size) const;
  VkDeviceSize block_size() const { return options_.block_size; }

 private:
  friend class PoolBuffer;
  struct Block;
  struct CachedRange {
    std::uint32_t block;
    VkDeviceSize offset;
    std::uint64_t fence;
  };
  struct Place {
    Block* block = nullptr;
    VkDeviceSize offset = 0;
  };

  void release(PoolBuffer& buffer) noexcept;
  Place take_cached(MemoryKind kind, VkDeviceSize class_size, std::uint64_t done);
  Place carve(MemoryKind kind, VkDeviceSize class_size);
  void return_cached(std::uint64_t done, const MemoryKind* only_kind);
  void give_back(Block& block, VkDeviceSize offset, VkDeviceSize size);
  TrimResult release_free_blocks(std::uint64_t unused_since = std::numeric_limits<std::uint64_t>::max());
  Block& new_block(MemoryKind kind, VkDeviceSize size);
  std::uint32_t owner_index(std::string_view owner);

  const ComputeQueue& queue_;
  const Device& device_;
  PoolOptions options_;
  VkDeviceSize alignment_;
  std::map<std::uint32_t, std::unique_ptr<Block>> blocks_;
  std::uint32_t next_block_id_ = 1;
  // Cached ranges by (kind, size class), oldest first.
  std::map<std::pair<MemoryKind, VkDeviceSize>, std::vector<CachedRange>> cache_;
  std::vector<std::string> owner_names_;
  std::vector<std::uint64_t> owner_active_;
  std::uint64_t active_ = 0, cached_ = 0, peak_ = 0, held_ = 0, epoch_ = 0;
};

}  // namespace mqlm::gpu
