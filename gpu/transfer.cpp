#include "gpu/transfer.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
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

// The copies' bytes [begin, end), counting through them end to end.
void copy_part(std::span<const HostCopy> copies, std::size_t begin, std::size_t end) {
  std::size_t at = 0;
  for (const HostCopy& c : copies) {
    const std::size_t from = std::max(begin, at), to = std::min(end, at + c.bytes);
    if (from < to) std::memcpy(c.to + (from - at), c.from + (from - at), to - from);
    at += c.bytes;
    if (at >= end) return;
  }
}

// memcpy on several threads when there is enough to copy: weights come from a mapped file, so the
// copy also takes the page faults, which threads take in parallel; KV pages are thousands of small
// copies that one thread would take longer over than the GPU takes over the transfer.
void copy_all(std::span<const HostCopy> copies) {
  constexpr std::size_t kPerThread = std::size_t{16} << 20;
  std::size_t bytes = 0;
  for (const HostCopy& c : copies) bytes += c.bytes;
  const std::size_t threads =
      std::min<std::size_t>({bytes / kPerThread, std::max(1u, std::thread::hardware_concurrency()), 8});
  if (threads <= 1) {
    copy_part(copies, 0, bytes);
    return;
  }
  const std::size_t share = (bytes + threads - 1) / threads;
  std::vector<std::jthread> helpers;
  for (std::size_t t = 1; t < threads; ++t) {
    const std::size_t begin = std::min(bytes, t * share), end = std::min(bytes, begin + share);
    if (begin < end) helpers.emplace_back([=] { copy_part(copies, begin, end); });
  }
  copy_part(copies, 0, std::min(share, bytes));
}

void copy_bytes(std::byte* to, const std::byte* from, std::size_t bytes) {
  const HostCopy copy{to, from, bytes};
  copy_all(std::span(&copy, 1));
}

// A region's part that goes through one staging chunk.
struct StagedPiece {
  BufferRange device;  // in the pool buffer
  VkDeviceSize staging_offset;
  std::byte* host = nullptr;  // downloads: where the bytes go once the chunk is on the host
};

std::size_t bytes_of(const UploadRegion& region) { return region.data.size(); }
std::size_t bytes_of(const DownloadRegion& region) { return region.out.size(); }

// Lays the regions end to end in staging chunks of `chunk` bytes, cutting a region where a chunk
// ends: on_piece(region, offset in region, bytes, offset in chunk) for each piece (offset in chunk
// 0 starts a chunk), on_chunk() after each chunk is full and after the last.
template <class Region, class OnPiece, class OnChunk>
void for_each_staged_piece(std::span<const Region> regions, std::size_t chunk, OnPiece on_piece, OnChunk on_chunk) {
  std::size_t fill = 0;
  for (const Region& region : regions) {
    const std::size_t size = bytes_of(region);
    for (std::size_t done = 0; done < size;) {
      const std::size_t bytes = std::min(chunk - fill, size - done);
      on_piece(region, done, bytes, fill);
      done += bytes;
      fill += bytes;
      if (fill == chunk) {
        on_chunk();
        fill = 0;
      }
    }
  }
  if (fill > 0) on_chunk();
}

// Records the copies between `staging` and the pieces' buffers: one vkCmdCopyBuffer per buffer
// listing all its regions, since Recording::copy takes one region and a chunk of KV pages holds
// thousands. The first piece goes through Recording::copy for its barrier, which orders the
// copies after the work submitted before them (steps that write or read these buffers).
void record_staged_copies(Recording& rec, const PoolBuffer& staging, std::vector<StagedPiece>& pieces, bool to_host) {
  std::ranges::stable_sort(pieces, std::less<>{}, [](const StagedPiece& p) { return p.device.buffer; });
  const BufferRange stage = staging.range();
  auto in_stage = [&](const StagedPiece& p) {
    return BufferRange{stage.buffer, stage.offset + p.staging_offset, p.device.size};
  };
  rec.after_previous_submissions();
  if (to_host) {
    rec.copy(pieces.front().device, in_stage(pieces.front()));
  } else {
    rec.copy(in_stage(pieces.front()), pieces.front().device);
  }
  std::vector<VkBufferCopy> copies;
  for (std::size_t i = 1; i < pieces.size();) {
    const VkBuffer buffer = pieces[i].device.buffer;
    copies.clear();
    for (; i < pieces.size() && pieces[i].device.buffer == buffer; ++i) {
      const BufferRange device = pieces[i].device, staged = in_stage(pieces[i]);
      copies.push_back(to_host ? VkBufferCopy{device.offset, staged.offset, device.size}
                               : VkBufferCopy{staged.offset, device.offset, device.size});
    }
    const auto count = static_cast<std::uint32_t>(copies.size());
    if (to_host) {
      vkCmdCopyBuffer(rec.command_buffer(), buffer, stage.buffer, count, copies.data());
    } else {
      vkCmdCopyBuffer(rec.command_buffer(), stage.buffer, buffer, count, copies.data());
    }
  }
  if (to_host) rec.make_visible_to_host();
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
  const UploadRegion region{dst, offset, data};
  upload(std::span(&region, 1));
}

void Uploader::upload(std::span<const UploadRegion> regions) {
  for (const UploadRegion& r : regions) check_fits(r.dst, r.offset, r.data.size());
  std::vector<UploadRegion> staged;
  std::vector<HostCopy> direct;
  for (const UploadRegion& r : regions) {
    if (r.data.empty()) continue;
    if (r.dst.mapped() != nullptr && !always_stage_) {
      direct.push_back({r.dst.mapped() + r.offset, r.data.data(), r.data.size()});
    } else {
      staged.push_back(r);
    }
  }
  copy_all(direct);
  std::vector<StagedPiece> pieces;
  std::vector<HostCopy> fills;
  std::size_t slot = 0;
  auto on_piece = [&](const UploadRegion& r, std::size_t done, std::size_t bytes, std::size_t at) {
    if (at == 0) {  // a new chunk, into the staging buffer the GPU copied from the longest ago
      slot = next_++ % 2;
      if (!staging_[slot]) staging_[slot] = pool_.allocate(chunk_, "staging", MemoryKind::host);
      if (in_flight_[slot] != 0) queue_.wait(in_flight_[slot]);
    }
    fills.push_back({staging_[slot].mapped() + at, r.data.data() + done, bytes});
    pieces.push_back({r.dst.range(r.offset + done, bytes), at});
  };
  auto on_chunk = [&] {
    copy_all(fills);
    auto rec = queue_.begin();
    rec.set_label("an upload");
    record_staged_copies(rec, staging_[slot], pieces, false);
    in_flight_[slot] = queue_.submit(rec);
    pieces.clear();
    fills.clear();
  };
  for_each_staged_piece(std::span<const UploadRegion>(staged), chunk_, on_piece, on_chunk);
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
  // Through staging even where the buffer could be mapped: what a device without host-visible
  // device memory does, and what the tests check on one that has it.
  const UploadRegion region{dst, offset, data};
  upload_regions(queue, pool, std::span(&region, 1), chunk_bytes, true);
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

void upload_regions(ComputeQueue& queue, BufferPool& pool, std::span<const UploadRegion> regions,
                    std::size_t chunk_bytes, bool always_stage) {
  std::size_t staged = 0;
  bool direct = false;
  for (const UploadRegion& r : regions) {
    check_fits(r.dst, r.offset, r.data.size());
    if (r.dst.mapped() != nullptr && !always_stage) {
      direct = direct || !r.data.empty();
    } else {
      staged += r.data.size();
    }
  }
  // Submitted work may still read what a direct write replaces; staged copies wait on the GPU.
  if (direct) queue.wait_idle();
  Uploader uploader(queue, pool, std::min(chunk_bytes, std::max<std::size_t>(staged, 1)), always_stage);
  uploader.upload(regions);
  uploader.finish();
}

void download_regions(ComputeQueue& queue, BufferPool& pool, std::span<const DownloadRegion> regions,
                      std::size_t chunk_bytes, bool always_stage) {
  if (chunk_bytes == 0) throw GpuError("a download in chunks of 0 bytes");
  for (const DownloadRegion& r : regions) check_fits(r.src, r.offset, r.out.size());
  std::vector<DownloadRegion> staged;
  std::size_t staged_bytes = 0;
  std::vector<HostCopy> direct;
  for (const DownloadRegion& r : regions) {
    if (r.out.empty()) continue;
    if (r.src.mapped() != nullptr && !always_stage) {
      direct.push_back({r.out.data(), r.src.mapped() + r.offset, r.out.size()});
    } else {
      staged.push_back(r);
      staged_bytes += r.out.size();
    }
  }
  if (!direct.empty()) {
    queue.wait_idle();  // for the bytes that submitted work writes
    copy_all(direct);
  }
  if (staged.empty()) return;
  const std::size_t chunk = std::min(chunk_bytes, staged_bytes);
  // Two staging buffers: the GPU fills one while the host copies the other out.
  struct Slot {
    PoolBuffer staging;
    std::vector<StagedPiece> pieces;
    std::uint64_t submitted = 0;
  };
  std::array<Slot, 2> slots;
  std::size_t next = 0;
  Slot* current = nullptr;
  auto drain = [&](Slot& s) {
    if (s.submitted == 0) return;
    queue.wait(s.submitted);
    std::vector<HostCopy> copies;
    for (const StagedPiece& p : s.pieces) copies.push_back({p.host, s.staging.mapped() + p.staging_offset, p.device.size});
    copy_all(copies);
    s.pieces.clear();
    s.submitted = 0;
  };
  auto on_piece = [&](const DownloadRegion& r, std::size_t done, std::size_t bytes, std::size_t at) {
    if (at == 0) {
      current = &slots[next++ % 2];
      drain(*current);
      if (!current->staging) current->staging = pool.allocate(chunk, "staging", MemoryKind::host);
    }
    current->pieces.push_back({r.src.range(r.offset + done, bytes), at, r.out.data() + done});
  };
  auto on_chunk = [&] {
    auto rec = queue.begin();
    rec.set_label("a copy to the host");
    record_staged_copies(rec, current->staging, current->pieces, true);
    current->submitted = queue.submit(rec);
  };
  for_each_staged_piece(std::span<const DownloadRegion>(staged), chunk, on_piece, on_chunk);
  drain(slots[next % 2]);  // the older chunk first
  drain(slots[(next + 1) % 2]);
}

void PendingDownload::copy_out() const { copy_all(copies); }

PendingDownload download_later(ComputeQueue& queue, BufferPool& pool, std::span<const DownloadRegion> regions) {
  std::size_t bytes = 0;
  for (const DownloadRegion& r : regions) {
    check_fits(r.src, r.offset, r.out.size());
    bytes += r.out.size();
  }
  PendingDownload pending;
  if (bytes == 0) return pending;
  pending.staging = pool.allocate(bytes, "staging", MemoryKind::host);
  std::vector<StagedPiece> pieces;
  std::size_t at = 0;
  for (const DownloadRegion& r : regions) {
    if (r.out.empty()) continue;
    pieces.push_back({r.src.range(r.offset, r.out.size()), at, r.out.data()});
    at += r.out.size();
  }
  auto rec = queue.begin();
  rec.set_label("a copy to the host");
  record_staged_copies(rec, pending.staging, pieces, true);
  pending.done = queue.submit(rec);
  pending.copies.reserve(pieces.size());
  for (const StagedPiece& p : pieces) {
    pending.copies.push_back({p.host, pending.staging.mapped() + p.staging_offset, p.device.size});
  }
  return pending;
}

}  // namespace mqlm::gpu
