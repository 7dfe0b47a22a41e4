// The buffer pool: statistics, trim, bounded growth under random churn, and that trim never
// releases memory the GPU may still read.
#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "gpu/ops.hpp"
#include "gpu_fixture.hpp"

namespace mqlm::gpu {
namespace {

using testing::shared_gpu;
constexpr VkDeviceSize MiB = VkDeviceSize{1} << 20;

// The bytes held by blocks that contain at least one of `live`: what active allocations need.
VkDeviceSize needed_by(const BufferPool& pool, const std::vector<PoolBuffer>& live) {
  std::map<VkBuffer, VkDeviceSize> blocks;
  for (const auto& b : live) {
    VkDeviceSize cls = pool.size_class(b.size());
    blocks[b.range().buffer] = std::max({blocks[b.range().buffer], pool.block_size(), cls});
  }
  VkDeviceSize total = 0;
  for (auto [buffer, size] : blocks) total += size;
  return total;
}

// Without a block size the pool takes its device's default: 512 MiB from 32 GiB of device memory
// (the H100 decodes faster from them), 256 MiB below.
TEST(BufferPool, TakesTheDevicesDefaultBlockSizeUnlessGivenOne) {
  EXPECT_EQ(default_block_size(VkDeviceSize{80} << 30), 512 * MiB);
  EXPECT_EQ(default_block_size(VkDeviceSize{32} << 30), 512 * MiB);
  EXPECT_EQ(default_block_size((VkDeviceSize{32} << 30) - 1), 256 * MiB);
  EXPECT_EQ(default_block_size(0), 256 * MiB);
  auto& gpu = shared_gpu();
  BufferPool chosen(gpu.queue), given(gpu.queue, PoolOptions{3 * MiB});
  EXPECT_EQ(chosen.block_size(), default_block_size(gpu.device.features().device_local_bytes));
  EXPECT_EQ(given.block_size(), 3 * MiB);
  PoolBuffer b = chosen.allocate(4096, "test");
  EXPECT_EQ(chosen.stats().held_bytes, chosen.block_size());
}

TEST(BufferPool, StatisticsFollowOwnersAndTrimLeavesOnlyWhatActiveNeeds) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  std::vector<PoolBuffer> weights, kv, scratch;
  for (int i = 0; i < 40; ++i) weights.push_back(pool.allocate(20'000 + 1000 * i, "weights:tiny"));
  for (int i = 0; i < 64; ++i) kv.push_back(pool.allocate(16 * 1024, "kv"));
  scratch.push_back(pool.allocate(3 * MiB, "scratch"));  // larger than a block: a block of its own
  for (int i = 0; i < 50; ++i) scratch.push_back(pool.allocate(777 * (i + 1), "scratch"));

  auto s = pool.stats();
  VkDeviceSize expect_weights = 0, expect_kv = 0;
  for (const auto& b : weights) expect_weights += pool.size_class(b.size());
  for (const auto& b : kv) expect_kv += pool.size_class(b.size());
  EXPECT_EQ(s.active_by_owner.at("weights:tiny"), expect_weights);
  EXPECT_EQ(s.active_by_owner.at("kv"), expect_kv);
  EXPECT_EQ(s.active_bytes, expect_weights + expect_kv + s.active_by_owner.at("scratch"));
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.peak_active_bytes, s.active_bytes);
  EXPECT_GE(s.held_bytes, s.active_bytes);

  // Free every other KV page, all scratch and most weights: the freed ranges are cached.
  std::vector<PoolBuffer> kept;
  for (std::size_t i = 0; i < kv.size(); i += 2) kept.push_back(std::move(kv[i]));
  kept.push_back(std::move(weights[7]));
  kv.clear();
  weights.clear();
  scratch.clear();
  s = pool.stats();
  EXPECT_GT(s.cached_bytes, 0u);
  EXPECT_EQ(s.active_by_owner.count("scratch"), 0u);
  EXPECT_EQ(s.active_bytes + s.cached_bytes, s.peak_active_bytes);

  auto trimmed = pool.trim();
  s = pool.stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_GT(trimmed.bytes_released, 3 * MiB);  // at least the dedicated block
  EXPECT_EQ(s.held_bytes, needed_by(pool, kept));
  std::set<VkBuffer> kept_blocks;
  for (const auto& k : kept) kept_blocks.insert(k.range().buffer);
  EXPECT_EQ(s.blocks, kept_blocks.size());

  // A freed range is reused for the next allocation of its size class.
  VkBuffer kv_buffer = kept[0].range().buffer;
  VkDeviceSize kv_offset = kept[0].range().offset;
  kept[0].reset();
  auto again = pool.allocate(16 * 1024 - 5, "kv");
  EXPECT_EQ(again.range().buffer, kv_buffer);
  EXPECT_EQ(again.range().offset, kv_offset);

  again.reset();
  kept.clear();
  pool.trim();
  s = pool.stats();
  EXPECT_EQ(s.held_bytes, 0u);
  EXPECT_EQ(s.blocks, 0u);
  EXPECT_EQ(s.active_bytes, 0u);
  EXPECT_TRUE(s.active_by_owner.empty());
}

// 10,000 rounds of random allocate / free / trim over `sizes` (at most max_small when they fit
// a block); asserts the statistics stay consistent and held stays within the peak active bytes
// plus one block plus per-block fragmentation; returns the largest held - peak seen.
VkDeviceSize churn(BufferPool& pool, std::uint64_t seed, VkDeviceSize max_small,
                   const std::function<VkDeviceSize(std::mt19937_64&)>& sizes) {
  std::mt19937_64 rng(seed);
  std::vector<PoolBuffer> live;
  std::uint64_t active = 0;
  VkDeviceSize worst = 0;
  for (int round = 0; round < 10'000; ++round) {
    int action = std::uniform_int_distribution<int>(0, 99)(rng);
    bool growing = (round / 1000) % 2 == 0;  // phases that grow and shrink the working set
    if (action < (growing ? 60 : 35) || live.empty()) {
      live.push_back(pool.allocate(sizes(rng), round % 3 == 0 ? "kv" : "scratch"));
      active += pool.size_class(live.back().size());
    } else if (action < 97) {
      std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      active -= pool.size_class(live[i].size());
      std::swap(live[i], live.back());
      live.pop_back();
    } else {
      pool.trim();
      auto s = pool.stats();
      EXPECT_EQ(s.cached_bytes, 0u) << "round " << round;
      EXPECT_EQ(s.held_bytes, needed_by(pool, live)) << "round " << round;
    }
    auto s = pool.stats();
    EXPECT_EQ(s.active_bytes, active) << "round " << round;
    // Beyond one block of slack, each block may lose its tail (less than the largest
    // allocation that goes into blocks) to fragmentation.
    VkDeviceSize slack = pool.block_size() + s.blocks * max_small;
    EXPECT_LE(s.held_bytes, s.peak_active_bytes + slack) << "round " << round << ", " << s.blocks << " blocks";
    if (s.held_bytes > s.peak_active_bytes) worst = std::max(worst, s.held_bytes - s.peak_active_bytes);
    if (round % 500 == 0) {  // live ranges never overlap
      std::map<VkBuffer, std::vector<std::pair<VkDeviceSize, VkDeviceSize>>> ranges;
      for (const auto& b : live) ranges[b.range().buffer].push_back({b.range().offset, pool.size_class(b.size())});
      for (auto& [buffer, rs] : ranges) {
        std::sort(rs.begin(), rs.end());
        for (std::size_t i = 1; i < rs.size(); ++i) EXPECT_LE(rs[i - 1].first + rs[i - 1].second, rs[i].first);
      }
    }
  }
  live.clear();
  pool.trim();
  EXPECT_EQ(pool.stats().held_bytes, 0u);
  return worst;
}

// Sizes as an executor allocates them: KV pages, per-step activations and logits of a few
// shapes, all well below a block (as a few MiB are below the default 256 MiB block), and now
// and then weights larger than a block.
// A trim that keeps the recent working set returns only the wholly free blocks that nothing has
// allocated from since the epoch it names.
TEST(BufferPool, TrimUnusedSinceKeepsTheBlocksRecentWorkUsed) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  PoolBuffer weights = pool.allocate(MiB / 2, "weights:tiny");
  const std::uint64_t base_held = pool.stats().held_bytes;
  {
    std::vector<PoolBuffer> large;  // an old step's scratch: six blocks, freed at its end
    for (int i = 0; i < 6; ++i) large.push_back(pool.allocate(MiB, "scratch"));
  }
  pool.begin_epoch();
  const std::uint64_t recent = pool.epoch();
  {
    std::vector<PoolBuffer> small;  // recent steps need four of them
    for (int i = 0; i < 4; ++i) small.push_back(pool.allocate(MiB, "scratch"));
  }
  EXPECT_EQ(pool.trim_unused_since(recent).blocks_released, 2u);
  auto s = pool.stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.held_bytes, base_held + 4 * MiB);
  {  // the next step of the same size finds its memory: no block is added
    std::vector<PoolBuffer> small;
    for (int i = 0; i < 4; ++i) small.push_back(pool.allocate(MiB, "scratch"));
    EXPECT_EQ(pool.stats().held_bytes, base_held + 4 * MiB);
  }
  // Once the epoch moves on without them, those blocks go too; the weights' block stays.
  pool.begin_epoch();
  EXPECT_EQ(pool.trim_unused_since(pool.epoch()).blocks_released, 4u);
  EXPECT_EQ(pool.stats().held_bytes, base_held);
}

TEST(BufferPool, RandomChurnHoldsAtMostPeakPlusOneBlockPlusFragmentation) {
  auto& gpu = shared_gpu();
  for (std::uint64_t seed : {42, 43, 44}) {
    BufferPool pool(gpu.queue, PoolOptions{MiB});
    auto worst = churn(pool, seed, 65536, [](std::mt19937_64& rng) {
      static constexpr VkDeviceSize menu[] = {1024, 4096, 12288, 16384, 32768, 57344, 65536};
      if (std::uniform_int_distribution<int>(0, 99)(rng) < 2) return VkDeviceSize{(3 + rng() % 4) * MiB / 2};
      return menu[rng() % std::size(menu)];
    });
    std::cout << "seed " << seed << ": worst held - peak " << worst << " bytes\n";
  }
}

// Arbitrary sizes: 64 B to 64 KiB, log-uniform, and 2% larger than a block.
TEST(BufferPool, RandomChurnOfArbitrarySizes) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  auto worst = churn(pool, 7, 65536, [](std::mt19937_64& rng) {
    if (std::uniform_int_distribution<int>(0, 99)(rng) < 2) {
      return static_cast<VkDeviceSize>(std::uniform_real_distribution<double>(1.2, 3.0)(rng) * MiB);
    }
    return static_cast<VkDeviceSize>(std::exp2(std::uniform_real_distribution<double>(6.0, 16.0)(rng)));
  });
  std::cout << "worst held - peak: " << worst << " bytes\n";
}

TEST(BufferPool, TrimReleasesMemoryOnlyAfterTheGpuFinishedReadingIt) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  // A gate the submission waits on, so the work stays unfinished until the test opens it.
  VkSemaphoreTypeCreateInfo type{};
  type.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
  type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  VkSemaphoreCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
  info.pNext = &type;
  VkSemaphore raw = VK_NULL_HANDLE;
  ASSERT_EQ(vkCreateSemaphore(gpu.device.get(), &info, nullptr, &raw), VK_SUCCESS);
  UniqueSemaphore gate(gpu.device.get(), raw);

  std::vector<std::uint32_t> data(MiB / 4);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint32_t>(i * 2654435761u);
  PoolBuffer src = pool.allocate(MiB, "weights:gated");  // exactly one block
  upload(gpu.queue, pool, src, std::span<const std::uint32_t>(data));
  PoolBuffer dst = pool.allocate(MiB, "scratch");
  VkBuffer src_buffer = src.range().buffer;
  VkDeviceSize src_offset = src.range().offset;

  auto rec = gpu.queue.begin();
  ops::copy(rec, gpu.kernels, src.range(), dst.range(), MiB);
  TimelineWait wait{gate.get(), 1};
  gpu.queue.submit(rec, std::span(&wait, 1));
  src.reset();  // freed while the copy has not run

  auto s = pool.stats();
  EXPECT_EQ(s.pending_bytes, MiB);
  EXPECT_EQ(s.held_bytes, 2 * MiB);
  // Not reusable yet: a new allocation of the same class gets other memory.
  PoolBuffer other = pool.allocate(MiB, "scratch");
  EXPECT_FALSE(other.range().buffer == src_buffer && other.range().offset == src_offset);
  other.reset();  // fenced by the unfinished submission too: the pool does not track which buffers a step uses
  // Trimming without waiting releases nothing while that work is unfinished.
  auto early = pool.trim_completed();
  EXPECT_EQ(early.bytes_released, 0u);
  EXPECT_EQ(pool.stats().held_bytes, 3 * MiB);
  EXPECT_EQ(pool.stats().pending_bytes, 2 * MiB);

  auto trimming = std::async(std::launch::async, [&pool] { return pool.trim(); });
  EXPECT_EQ(trimming.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "trim returned while the GPU work was still blocked";
  VkSemaphoreSignalInfo signal{};
  signal.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO;
  signal.semaphore = gate.get();
  signal.value = 1;
  ASSERT_EQ(vkSignalSemaphore(gpu.device.get(), &signal), VK_SUCCESS);
  auto late = trimming.get();
  EXPECT_EQ(late.bytes_released, 2 * MiB);
  EXPECT_EQ(pool.stats().held_bytes, MiB);
  EXPECT_EQ(pool.stats().pending_bytes, 0u);
  // The copy read the freed buffer's contents intact.
  EXPECT_EQ(download<std::uint32_t>(gpu.queue, pool, dst, data.size()), data);
}

// The staged upload (what a device without host-visible device memory gets): chunks through two
// staging buffers in turn, the GPU copying one while the host fills the other. Whatever the chunk
// size, at any offset, the buffer holds exactly the bytes, and no staging memory stays in use.
TEST(BufferPool, StagedUploadInChunksArrivesWhole) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  const std::size_t words = (5 * MiB + 12344) / 4;
  std::vector<std::uint32_t> data(words);
  for (std::size_t i = 0; i < words; ++i) data[i] = static_cast<std::uint32_t>(i * 2246822519u + 7);
  const auto bytes = std::as_bytes(std::span<const std::uint32_t>(data));
  for (std::size_t chunk : {std::size_t{MiB}, std::size_t{3 * MiB + 4}, std::size_t{64} << 20, std::size_t{4096}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    PoolBuffer dst = pool.allocate(bytes.size() + 256, "weights:staged");
    upload_staged(gpu.queue, pool, dst, bytes, 256, chunk);
    EXPECT_EQ(download<std::uint32_t>(gpu.queue, pool, dst, words, 256), data);
    EXPECT_EQ(pool.stats().active_by_owner.count("staging"), 0u) << "staging memory left in use";
  }
  PoolBuffer small = pool.allocate(16, "scratch");
  EXPECT_THROW(upload_staged(gpu.queue, pool, small, bytes, 0, MiB), GpuError);  // does not fit
  EXPECT_THROW(upload_staged(gpu.queue, pool, small, bytes.first(16), 0, 0), GpuError);  // no chunk size
}

// Step inputs written by the command buffer itself (Recording::update) arrive whole, in order with
// the commands around them (a fill before, an update of part of it after), and sizes the command
// cannot carry (not whole words, more than 64 KiB, past the range) are refused.
TEST(Recording, UpdateWritesItsWordsInOrderWithTheCommandsAroundIt) {
  auto& gpu = shared_gpu();
  std::vector<std::uint32_t> words(65536 / 4);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<std::uint32_t>(i * 2654435761u);
  PoolBuffer dst = gpu.pool.allocate(65536 + 64, "scratch");
  const std::vector<std::uint32_t> patch{1, 2, 3};
  {
    auto rec = gpu.queue.begin();
    rec.fill(dst.range(), 0xABABABABu);
    rec.update(BufferRange{dst.range().buffer, dst.range().offset, 65536}, std::as_bytes(std::span(words)));
    rec.update(BufferRange{dst.range().buffer, dst.range().offset + 8, 12}, std::as_bytes(std::span(patch)));
    gpu.queue.submit_and_wait(rec);
  }
  auto got = download<std::uint32_t>(gpu.queue, gpu.pool, dst, words.size() + 16);
  std::vector<std::uint32_t> want = words;
  std::copy(patch.begin(), patch.end(), want.begin() + 2);
  want.resize(words.size() + 16, 0xABABABABu);
  EXPECT_EQ(got, want);
  auto rec = gpu.queue.begin();
  const std::vector<std::byte> odd(6), big(65540);
  EXPECT_THROW(rec.update(dst.range(), odd), GpuError);
  EXPECT_THROW(rec.update(dst.range(), big), GpuError);
  EXPECT_THROW(rec.update(BufferRange{dst.range().buffer, dst.range().offset, 8}, std::as_bytes(std::span(patch))),
               GpuError);
}

// A model's tensors go through one Uploader, its two staging buffers taking turns across the
// uploads: each buffer ends up with its own bytes once finish() returns.
TEST(BufferPool, OneUploaderForManyBuffersKeepsEachIntact) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  std::vector<std::vector<std::uint32_t>> tensors;
  std::vector<PoolBuffer> buffers;
  {
    Uploader uploader(gpu.queue, pool, MiB, true);
    for (std::size_t words : {std::size_t{1}, MiB / 4 + 3, std::size_t{777}, 3 * MiB / 4, std::size_t{64}}) {
      std::vector<std::uint32_t> data(words);
      for (std::size_t i = 0; i < words; ++i) data[i] = static_cast<std::uint32_t>((tensors.size() + 1) * 40503u + i);
      buffers.push_back(uploader.upload_new(std::as_bytes(std::span<const std::uint32_t>(data)), "weights:many"));
      tensors.push_back(std::move(data));
    }
    uploader.finish();
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      EXPECT_EQ(download<std::uint32_t>(gpu.queue, pool, buffers[t], tensors[t].size()), tensors[t]) << "tensor " << t;
    }
    EXPECT_EQ(pool.stats().active_by_owner.at("staging"), 2 * MiB);  // the two staging buffers, while it lives
  }
  EXPECT_EQ(pool.stats().active_by_owner.count("staging"), 0u);
}

TEST(BufferPool, HostMemoryIsMappedAndCountedApart) {
  auto& gpu = shared_gpu();
  BufferPool pool(gpu.queue, PoolOptions{MiB});
  auto staging = pool.allocate(1000, "staging", MemoryKind::host);
  ASSERT_NE(staging.mapped(), nullptr);
  auto device = pool.allocate(1000, "kv");
  EXPECT_EQ(pool.stats().blocks, 2u);  // kinds never share a block
  EXPECT_EQ(pool.stats().active_by_owner.at("staging"), pool.size_class(1000));
  EXPECT_THROW((void)staging.range(900, 200), GpuError);
}

// A download that does not wait (a KV spill ahead of the step that overwrites its pages): work
// submitted after it that overwrites the source leaves the downloaded bytes as they were.
TEST(DownloadLater, ReadsTheRegionsBeforeLaterWorkOverwritesThem) {
  auto& gpu = shared_gpu();
  constexpr std::size_t kBytes = 64 << 10;
  std::vector<std::uint32_t> pattern(kBytes / 4);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint32_t>(i * 2654435761u);
  PoolBuffer src = gpu.up(pattern), zeros = gpu.up(std::vector<std::uint32_t>(kBytes / 4, 0));
  const auto bytes = std::as_bytes(std::span(pattern));
  std::vector<std::byte> a(1000), b(16), c(5536);
  const std::vector<DownloadRegion> regions{{src, 4096, a}, {src, 0, b}, {src, kBytes - c.size(), c}};
  PendingDownload later = download_later(gpu.queue, gpu.pool, regions);
  ASSERT_NE(later.done, 0u);

  auto rec = gpu.queue.begin();
  rec.after_previous_submissions();
  ops::copy(rec, gpu.kernels, zeros.range(), src.range(), kBytes);
  gpu.queue.submit_and_wait(rec);
  ASSERT_GE(gpu.queue.completed(), later.done);
  later.copy_out();
  EXPECT_TRUE(std::ranges::equal(a, bytes.subspan(4096, a.size())));
  EXPECT_TRUE(std::ranges::equal(b, bytes.first(b.size())));
  EXPECT_TRUE(std::ranges::equal(c, bytes.last(c.size())));
  EXPECT_EQ(gpu.down<std::uint32_t>(src, 4), std::vector<std::uint32_t>(4, 0)) << "the overwrite did not run";

  const PendingDownload nothing = download_later(gpu.queue, gpu.pool, {});
  EXPECT_EQ(nothing.done, 0u);
  EXPECT_FALSE(nothing.staging);
  std::vector<std::byte> too_far(16);
  const std::vector<DownloadRegion> outside{{src, kBytes - 8, too_far}};
  EXPECT_THROW(download_later(gpu.queue, gpu.pool, outside), GpuError);
}

}  // namespace
}  // namespace mqlm::gpu
