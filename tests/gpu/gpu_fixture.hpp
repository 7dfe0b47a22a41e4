// What every GPU test needs: the device (lavapipe here), its queue, a pool and the kernels,
// created once per test binary, plus helpers that move vectors in and out of pool buffers.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "gpu/buffer_pool.hpp"
#include "gpu/device.hpp"
#include "gpu/fragment_layout.hpp"
#include "gpu/kernel_library.hpp"
#include "gpu/transfer.hpp"

namespace mqlm::gpu::testing {

struct Gpu {
  Gpu() : queue(device), pool(queue, PoolOptions{VkDeviceSize{8} << 20}), kernels(device) {
    probe_fragment_layout(kernels, queue, pool);  // the direct matmul where the device allows it
  }
  Device device;
  ComputeQueue queue;
  BufferPool pool;
  KernelLibrary kernels;

  template <class T>
  PoolBuffer up(const std::vector<T>& data, std::string_view owner = "test") {
    return upload_new(queue, pool, std::span<const T>(data), owner);
  }
  PoolBuffer scratch(VkDeviceSize bytes) { return pool.allocate(bytes, "scratch"); }
  template <class T>
  std::vector<T> down(const PoolBuffer& buffer, std::size_t count) {
    return download<T>(queue, pool, buffer, count);
  }
};

// The process-wide instance (GTest runs tests one after another on one thread).
inline Gpu& shared_gpu() {
  static Gpu gpu;
  return gpu;
}

}  // namespace mqlm::gpu::testing
