// Copies between host memory and pool buffers: straight through the mapping when the buffer is
// host-visible (lavapipe, resizable-BAR memory), else through a staging buffer and a copy
// command. All but download_later wait for the GPU: they are for loading weights, restoring KV
// pages, tests and benchmarks, not the per-step path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "gpu/buffer_pool.hpp"

namespace mqlm::gpu {

// One piece of a batched copy: bytes at `offset` of a pool buffer and the host bytes they come
// from or go to (as many as the span holds). The buffer must outlive the copy.
struct UploadRegion {
  const PoolBuffer& dst;
  VkDeviceSize offset;
  std::span<const std::byte> data;
};
struct DownloadRegion {
  const PoolBuffer& src;
  VkDeviceSize offset;
  std::span<std::byte> out;
};

void upload_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const std::byte> data,
                  VkDeviceSize offset = 0);

// Many uploads in a row (a model's weights): each goes in chunks of `chunk_bytes` through two host
// staging buffers kept for all of them, the GPU copying one chunk while the host fills the other
// (large copies on several threads); a buffer the host can map is written directly. For buffers
// that no submitted work uses. upload() returns once the bytes are copied out of `data`;
// finish() (and the destructor) once the GPU has all of them.
class Uploader {
 public:
  // always_stage: through the staging buffers even where the buffer could be mapped (tests).
  Uploader(ComputeQueue& queue, BufferPool& pool, std::size_t chunk_bytes = std::size_t{64} << 20,
           bool always_stage = false);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  void upload(const PoolBuffer& dst, std::span<const std::byte> data, VkDeviceSize offset = 0);
  // Many regions packed into the staging chunks: one submission per chunk however many regions
  // it holds (a KV page is hundreds of small regions).
  void upload(std::span<const UploadRegion> regions);
  PoolBuffer upload_new(std::span<const std::byte> data, std::string_view owner);
  void finish();

 private:
  ComputeQueue& queue_;
  BufferPool& pool_;
  std::size_t chunk_;
  bool always_stage_;
  PoolBuffer staging_[2];
  std::uint64_t in_flight_[2] = {0, 0};  // the submission that still reads each staging buffer
  std::size_t next_ = 0;
};

// One upload through an Uploader of `chunk_bytes` (what upload_bytes does for a buffer the host
// cannot map); returns when the GPU has all of it.
void upload_staged(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const std::byte> data,
                   VkDeviceSize offset, std::size_t chunk_bytes = std::size_t{64} << 20);
void download_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& src, std::span<std::byte> out,
                    VkDeviceSize offset = 0);

// Many scattered regions in a few submissions: staged in chunks of `chunk_bytes` (one submission
// each, with one copy command per buffer listing all its regions), or copied through the mapping
// where a buffer has one and `always_stage` is off (tests set it to run the staged path on
// lavapipe). Both come after all work submitted before them and return when the copy is done:
// the bytes on the host, or in the buffers for work submitted afterwards. Regions written must
// not overlap.
void upload_regions(ComputeQueue& queue, BufferPool& pool, std::span<const UploadRegion> regions,
                    std::size_t chunk_bytes = std::size_t{64} << 20, bool always_stage = false);
void download_regions(ComputeQueue& queue, BufferPool& pool, std::span<const DownloadRegion> regions,
                      std::size_t chunk_bytes = std::size_t{64} << 20, bool always_stage = false);

// Host bytes to copy: `bytes` from `from` to `to`.
struct HostCopy {
  std::byte* to;
  const std::byte* from;
  std::size_t bytes;
};

// A download that was recorded and submitted without waiting for it: its bytes are in `staging`
// (host memory) once the queue's completed() reaches `done`. Then copy_out() moves them to the
// regions' host memory; it touches nothing else, so it may run on another thread, as long as
// whoever owns the PendingDownload keeps it (and its staging buffer) until it returns.
struct PendingDownload {
  PoolBuffer staging;
  std::vector<HostCopy> copies;
  std::uint64_t done = 0;
  void copy_out() const;
};

// Copies the regions to the host behind all work submitted before it, returning as soon as the
// copy is submitted: work submitted afterwards that begins with a barrier
// (Recording::after_previous_submissions) may then overwrite them (a step writing into KV pages
// spilled to the host: the copy reads them first, on the GPU's timeline). Always through one
// staging buffer of host memory, also where the buffers are mapped: the host reading device
// memory through a mapping is slow, and would have to wait for the GPU.
PendingDownload download_later(ComputeQueue& queue, BufferPool& pool, std::span<const DownloadRegion> regions);

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
