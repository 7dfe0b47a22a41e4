#include "gpu/transfer.hpp"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace mqlm::gpu {

namespace {

void check_fits(const PoolBuffer& buffer, VkDeviceSize offset, std::size_t bytes) {
  if (offset + bytes > buffer.size()) {
    throw GpuError(fmt::format("transfer of {} bytes at offset {} overruns a buffer of {} bytes", bytes, offset,
                               buffer.size()));
  }
}

// memcpy on several threads when there is enough to copy: weights come from a mapped file, so the
// copy also takes the page faults, which threads take in parallel.
void copy_bytes(std::byte* to, const std::byte* from, std::size_t bytes) {
  constexpr std::size_t kPerThread = std::size_t{16} << 20;
  const std::size_t threads =
      std::min<std::size_t>({bytes / kPerThread, std::max(1u, std::thread::hardware_concurrency()), 8});
  if (threads <= 1) {
    std::memcpy(to, from, bytes);
    return;
  }
  const std::size_t piece = (bytes + threads - 1) / threads;
  std::vector<std::jthread> helpers;
  for (std::size_t t = 1; t < threads; ++t) {
    const std::size_t begin = t * piece, size = std::min(piece, bytes - std::min(bytes, begin));
    if (size > 0) helpers.emplace_back([=] { std::memcpy(to + begin, from + begin, size); });
  }
  std::memcpy(to, from, std::min(piece, bytes));
}

}  // namespace

Uploader::Uploader(ComputeQueue& queue, BufferPool& pool, std::size_t chunk_bytes, bool always_stage)
    : queue_(queue), pool_(pool), chunk_(chunk_bytes), always_stage_(always_stage) {
  if (chunk_bytes == 0) throw GpuError("an upload in chunks of 0 bytes");
}

Uploader::~Uploader() {
  try {
    finish();
  } catch (const GpuError&) {
    // A lost device: the staging buffers go back to the pool, which fences them itself.
  }
}

void Uploader::upload(const PoolBuffer& dst, std::span<const std::byte> data, VkDeviceSize offset) {
  check_fits(dst, offset, data.size());
  if (data.empty()) return;
  if (dst.mapped() != nullptr && !always_stage_) {
    copy_bytes(dst.mapped() + offset, data.data(), data.size());
    return;
  }
  for (std::size_t done = 0; done < data.size();) {
    const std::size_t slot = next_++ % 2;
    PoolBuffer& staging = staging_[slot];
    if (!staging) staging = pool_.allocate(chunk_, "staging", MemoryKind::host);
    if (in_flight_[slot] != 0) queue_.wait(in_flight_[slot]);
    const std::size_t bytes = std::min(chunk_, data.size() - done);
    copy_bytes(staging.mapped(), data.data() + done, bytes);
    auto rec = queue_.begin();
    rec.copy(staging.range(0, bytes), dst.range(offset + done, bytes));
    in_flight_[slot] = queue_.submit(rec);
    done += bytes;
  }
}

PoolBuffer Uploader::upload_new(std::span<const std::byte> data, std::string_view owner) {
  PoolBuffer buffer = pool_.allocate(std::max<VkDeviceSize>(data.size(), 4), owner);
  upload(buffer, data);
  return buffer;
}

void Uploader::finish() {
  for (std::size_t slot = 0; slot < 2; ++slot) {
    if (in_flight_[slot] != 0) queue_.wait(in_flight_[slot]);
    in_flight_[slot] = 0;
  }
}

void upload_staged(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const std::byte> data,
                   VkDeviceSize offset, std::size_t chunk_bytes) {
  check_fits(dst, offset, data.size());
  if (data.empty()) return;
  queue.wait_idle();  // submitted work may still read the old contents
  // Through staging even where the buffer could be mapped: what a device without host-visible
  // device memory does, and what the tests check on one that has it.
  Uploader uploader(queue, pool, std::min(chunk_bytes, data.size()), true);
  uploader.upload(dst, data, offset);
  uploader.finish();
}

void upload_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const std::byte> data,
                  VkDeviceSize offset) {
  check_fits(dst, offset, data.size());
  if (data.empty()) return;
  if (dst.mapped() == nullptr) {
    upload_staged(queue, pool, dst, data, offset);
    return;
  }
  queue.wait_idle();  // submitted work may still read the old contents
  copy_bytes(dst.mapped() + offset, data.data(), data.size());
}

void download_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& src, std::span<std::byte> out,
                    VkDeviceSize offset) {
  check_fits(src, offset, out.size());
  if (out.empty()) return;
  queue.wait_idle();
  if (src.mapped() != nullptr) {
    std::memcpy(out.data(), src.mapped() + offset, out.size());
    return;
  }
  PoolBuffer staging = pool.allocate(out.size(), "staging", MemoryKind::host);
  auto rec = queue.begin();
  rec.copy(src.range(offset, out.size()), staging.range());
  queue.submit_and_wait(rec);
  std::memcpy(out.data(), staging.mapped(), out.size());
}

}  // namespace mqlm::gpu
