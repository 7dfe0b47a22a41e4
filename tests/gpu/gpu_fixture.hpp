// What every GPU test needs: the device (lavapipe here), its queue, a pool and the kernels,
// created once per test binary, plus helpers that move vectors in and out of pool buffers.
#pragma once

#include <memory>
#include <random>
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

// Records what `record` records into one submission and waits for it.
template <class Record>
void run_step(Gpu& gpu, Record&& record) {
  auto rec = gpu.queue.begin();
  record(rec);
  gpu.queue.submit_and_wait(rec);
}

// n values from normal(0, scale), the same for the same seed.
inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// sum (got - want)^2 / sum want^2: what the kernel tests bound.
inline double normalised_error(std::span<const float> got, std::span<const float> want) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return err / norm;
}

}  // namespace mqlm::gpu::testing
