#include "gpu/transfer.hpp"

#include <cstring>

#include <fmt/format.h>

namespace mqlm::gpu {

namespace {

void check_fits(const PoolBuffer& buffer, VkDeviceSize offset, std::size_t bytes) {
  if (offset + bytes > buffer.size()) {
    throw GpuError(fmt::format("transfer of {} bytes at offset {} overruns a buffer of {} bytes", bytes, offset,
                               buffer.size()));
  }
}

}  // namespace

void upload_bytes(ComputeQueue& queue, BufferPool& pool, const PoolBuffer& dst, std::span<const std::byte> data,
                  VkDeviceSize offset) {
  check_fits(dst, offset, data.size());
  if (data.empty()) return;
  queue.wait_idle();  // submitted work may still read the old contents
  if (dst.mapped() != nullptr) {
    std::memcpy(dst.mapped() + offset, data.data(), data.size());
    return;
  }
  PoolBuffer staging = pool.allocate(data.size(), "staging", MemoryKind::host);
  std::memcpy(staging.mapped(), data.data(), data.size());
  auto rec = queue.begin();
  rec.copy(staging.range(), dst.range(offset, data.size()));
  queue.submit_and_wait(rec);
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
