#include "gpu/buffer_pool.hpp"

#include <algorithm>
#include <bit>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace mqlm::gpu {

struct BufferPool::Block {
  std::uint32_t id;
  MemoryKind kind;
  VkDeviceSize size;
  UniqueMemory memory;  // declared first so the buffer is destroyed before its memory
  UniqueBuffer buffer;
  std::byte* mapped = nullptr;
  std::map<VkDeviceSize, VkDeviceSize> free;  // offset -> length, coalesced, not in the cache
  std::uint64_t active_ranges = 0;
  std::uint64_t cached_ranges = 0;
  bool dedicated = false;  // larger than a block, holds one allocation: never carved
  std::uint64_t epoch = 0;  // the pool's epoch at the block's latest allocation
};

namespace {

VkDeviceSize round_up(VkDeviceSize n, VkDeviceSize to) { return (n + to - 1) / to * to; }

}  // namespace

PoolBuffer& PoolBuffer::operator=(PoolBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    block_ = other.block_;
    owner_ = other.owner_;
    buffer_ = other.buffer_;
    offset_ = other.offset_;
    size_ = other.size_;
    class_size_ = other.class_size_;
    kind_ = other.kind_;
    mapped_ = other.mapped_;
  }
  return *this;
}

void PoolBuffer::reset() {
  if (pool_ != nullptr) std::exchange(pool_, nullptr)->release(*this);
}

BufferRange PoolBuffer::range(VkDeviceSize offset, VkDeviceSize size) const {
  if (offset + size > size_) {
    throw GpuError(fmt::format("sub-range [{}, {}) lies outside a buffer of {} bytes", offset, offset + size, size_));
  }
  return {buffer_, offset_ + offset, size};
}

VkDeviceSize default_block_size(std::uint64_t device_local_bytes) {
  constexpr VkDeviceSize kMiB = VkDeviceSize{1} << 20;
  return device_local_bytes >= (std::uint64_t{32} << 30) ? 512 * kMiB : 256 * kMiB;
}

BufferPool::BufferPool(const ComputeQueue& queue, PoolOptions options)
    : queue_(queue), device_(queue.device()), options_(options) {
  alignment_ = std::max<VkDeviceSize>(256, device_.features().storage_offset_alignment);
  if (options_.block_size == 0) options_.block_size = default_block_size(device_.features().device_local_bytes);
  options_.block_size = round_up(std::max(options_.block_size, alignment_), alignment_);
}

BufferPool::~BufferPool() {
  if (active_ > 0) spdlog::error("buffer pool destroyed with {} bytes still allocated", active_);
  try {
    queue_.wait_idle();  // nothing is released while the GPU may read it
  } catch (const GpuError& e) {
    spdlog::error("buffer pool teardown: {}", e.what());
  }
}

VkDeviceSize BufferPool::size_class(VkDeviceSize size) const {
  VkDeviceSize n = round_up(std::max<VkDeviceSize>(size, 1), alignment_);
  if (n <= 16 * alignment_) return n;
  VkDeviceSize step = std::bit_floor(n) / 8;  // classes 1/8 of a power of two apart: at most 12.5% waste
  return round_up(n, std::max(step, alignment_));
}

std::uint32_t BufferPool::owner_index(std::string_view owner) {
  auto it = std::find(owner_names_.begin(), owner_names_.end(), owner);
  if (it != owner_names_.end()) return static_cast<std::uint32_t>(it - owner_names_.begin());
  owner_names_.emplace_back(owner);
  owner_active_.push_back(0);
  return static_cast<std::uint32_t>(owner_names_.size() - 1);
}

PoolBuffer BufferPool::allocate(VkDeviceSize size, std::string_view owner, MemoryKind kind) {
  VkDeviceSize class_size = size_class(size);
  std::uint64_t done = queue_.completed();
  Place place = take_cached(kind, class_size, done);
  if (place.block == nullptr) place = carve(kind, class_size);
  if (place.block == nullptr) {
    return_cached(done, &kind);  // coalesce what the cache holds before asking the driver
    place = carve(kind, class_size);
  }
  if (place.block == nullptr) {
    // Before asking the driver for more, give back blocks nothing uses (all kinds): this is
    // what keeps held bytes within the peak working set plus one block.
    return_cached(done, nullptr);
    release_free_blocks();
    VkDeviceSize block_size = std::max(options_.block_size, class_size);
    Block* block = nullptr;
    try {
      block = &new_block(kind, block_size);
    } catch (const OutOfDeviceMemory&) {
      trim();
      place = carve(kind, class_size);
      if (place.block == nullptr) block = &new_block(kind, block_size);
    }
    if (block != nullptr) {
      block->dedicated = block_size > options_.block_size;
      block->free.clear();
      if (block_size > class_size) block->free[class_size] = block_size - class_size;
      place = {block, 0};
    }
  }
  place.block->active_ranges++;
  PoolBuffer buffer;
  buffer.pool_ = this;
  buffer.block_ = place.block->id;
  buffer.owner_ = owner_index(owner);
  buffer.buffer_ = place.block->buffer.get();
  buffer.offset_ = place.offset;
  buffer.size_ = size;
  buffer.class_size_ = class_size;
  buffer.kind_ = kind;
  buffer.mapped_ = place.block->mapped != nullptr ? place.block->mapped + place.offset : nullptr;
  active_ += class_size;
  owner_active_[buffer.owner_] += class_size;
  peak_ = std::max(peak_, active_);
  place.block->epoch = epoch_;
  return buffer;
}

BufferPool::Place BufferPool::take_cached(MemoryKind kind, VkDeviceSize class_size, std::uint64_t done) {
  auto it = cache_.find({kind, class_size});
  if (it == cache_.end()) return {};
  auto& ranges = it->second;
  for (auto r = ranges.begin(); r != ranges.end(); ++r) {
    if (r->fence > done) continue;
    Block& block = *blocks_.at(r->block);
    Place place{&block, r->offset};
    ranges.erase(r);
    block.cached_ranges--;
    cached_ -= class_size;
    return place;
  }
  return {};
}

BufferPool::Place BufferPool::carve(MemoryKind kind, VkDeviceSize class_size) {
  // Address-ordered first fit, oldest block first: packs live ranges towards the old blocks so
  // that the newest ones empty out and trim can return them.
  for (auto& [id, block] : blocks_) {
    if (block->kind != kind || block->dedicated) continue;
    for (auto [offset, length] : block->free) {
      if (length < class_size) continue;
      block->free.erase(offset);
      if (length > class_size) block->free[offset + class_size] = length - class_size;
      return {block.get(), offset};
    }
  }
  return {};
}

void BufferPool::give_back(Block& block, VkDeviceSize offset, VkDeviceSize size) {
  auto next = block.free.find(offset + size);
  if (next != block.free.end()) {
    size += next->second;
    block.free.erase(next);
  }
  auto it = block.free.emplace(offset, size).first;
  if (it != block.free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == offset) {
      prev->second += it->second;
      block.free.erase(it);
    }
  }
}

void BufferPool::return_cached(std::uint64_t done, const MemoryKind* only_kind) {
  for (auto& [key, ranges] : cache_) {
    if (only_kind != nullptr && key.first != *only_kind) continue;
    auto keep = std::stable_partition(ranges.begin(), ranges.end(), [done](const CachedRange& r) { return r.fence > done; });
    for (auto r = keep; r != ranges.end(); ++r) {
      Block& block = *blocks_.at(r->block);
      give_back(block, r->offset, key.second);
      block.cached_ranges--;
      cached_ -= key.second;
    }
    ranges.erase(keep, ranges.end());
  }
  std::erase_if(cache_, [](const auto& entry) { return entry.second.empty(); });
}

// Wholly free blocks last allocated from before epoch `unused_since` (all of them by default).
TrimResult BufferPool::release_free_blocks(std::uint64_t unused_since) {
  TrimResult result;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    Block& block = *it->second;
    if (block.active_ranges == 0 && block.cached_ranges == 0 && block.epoch < unused_since) {
      result.bytes_released += block.size;
      result.blocks_released++;
      held_ -= block.size;
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
  return result;
}

TrimResult BufferPool::trim() { return trim_unused_since(std::numeric_limits<std::uint64_t>::max()); }

TrimResult BufferPool::trim_completed() {
  return_cached(queue_.completed(), nullptr);
  return release_free_blocks();
}

TrimResult BufferPool::trim_unused_since(std::uint64_t epoch) {
  queue_.wait(queue_.last_submitted());
  return_cached(queue_.completed(), nullptr);
  return release_free_blocks(epoch);
}

void BufferPool::release(PoolBuffer& buffer) noexcept {
  Block& block = *blocks_.at(buffer.block_);
  block.active_ranges--;
  block.cached_ranges++;
  cache_[{buffer.kind_, buffer.class_size_}].push_back({buffer.block_, buffer.offset_, queue_.free_fence()});
  active_ -= buffer.class_size_;
  owner_active_[buffer.owner_] -= buffer.class_size_;
  cached_ += buffer.class_size_;
}

BufferPool::Block& BufferPool::new_block(MemoryKind kind, VkDeviceSize size) {
  VkDevice dev = device_.get();
  VkBufferCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  info.size = size;
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  check(vkCreateBuffer(dev, &info, nullptr, &buffer), fmt::format("vkCreateBuffer of {} bytes", size));
  auto block = std::make_unique<Block>();
  block->id = next_block_id_++;
  block->kind = kind;
  block->size = size;
  block->buffer = {dev, buffer};

  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, buffer, &req);
  std::uint32_t type =
      kind == MemoryKind::device
          ? device_.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
          : device_.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  VkMemoryAllocateInfo alloc{};
  alloc.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
  alloc.allocationSize = req.size;
  alloc.memoryTypeIndex = type;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkResult result = vkAllocateMemory(dev, &alloc, nullptr, &memory);
  if (result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY) {
    throw OutOfDeviceMemory(fmt::format(
        "the GPU has no room for a block of {} MiB ({} MiB held by the pool: {} MiB active, {} MiB cached)", size >> 20,
        held_ >> 20, active_ >> 20, cached_ >> 20));
  }
  check(result, fmt::format("vkAllocateMemory of {} bytes", req.size));
  block->memory = {dev, memory};
  check(vkBindBufferMemory(dev, buffer, memory, 0), "vkBindBufferMemory");
  if (device_.memory_flags(type) & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
    void* mapped = nullptr;
    check(vkMapMemory(dev, memory, 0, VK_WHOLE_SIZE, 0, &mapped), "vkMapMemory");
    block->mapped = static_cast<std::byte*>(mapped);
  }
  block->free[0] = size;
  held_ += size;
  Block& ref = *block;
  blocks_.emplace(ref.id, std::move(block));
  return ref;
}

PoolStats BufferPool::stats() const {
  PoolStats s;
  s.active_bytes = active_;
  s.cached_bytes = cached_;
  s.peak_active_bytes = peak_;
  s.held_bytes = held_;
  s.blocks = blocks_.size();
  std::uint64_t done = queue_.completed();
  for (const auto& [key, ranges] : cache_) {
    for (const auto& r : ranges) {
      if (r.fence > done) s.pending_bytes += key.second;
    }
  }
  for (std::size_t i = 0; i < owner_names_.size(); ++i) {
    if (owner_active_[i] > 0) s.active_by_owner[owner_names_[i]] += owner_active_[i];
  }
  return s;
}

void BufferPool::reset_peak() { peak_ = active_; }

}  // namespace mqlm::gpu
