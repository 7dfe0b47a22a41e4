// Copies between host memory and pool buffers: straight through the mapping when the buffer is
// host-visible (lavapipe, resizable-BAR memory), else through a staging buffer and a copy
// command. Both wait for the GPU: they are for loading weights, tests and benchmarks, not the
// per-step path.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "gpu/buffer_pool.hpp"

namespace mqlm::gpu {

void upload_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const std::byte> data,
                  VkDeviceSize offset = 0);
void download_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& src, std::span<std::byte> out,
                    VkDeviceSize offset = 0);

template <class T>
void upload(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const T> data, VkDeviceSize offset = 0) {
  upload_bytes(queue, pool, dst, std::as_bytes(data), offset);
}

template <class T>
std::vector<T> download(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& src, std::size_t count,
                        VkDeviceSize offset = 0) {
  std::vector<T> out(count);
  download_bytes(queue, pool, src, std::as_writable_bytes(std::span(out)), offset);
  return out;
}

// A new device buffer holding `data`.
template <class T>
PoolBuffer upload_new(ComputeQueue& queue, BufferPool& pool, std::span<const T> data, std::string_view owner) {
  PoolBuffer buffer = pool.allocate(std::max<VkDeviceSize>(data.size_bytes(), 4), owner);
  upload(queue, pool, buffer, data);
  return buffer;
}

}  // namespace mqlm::gpu
