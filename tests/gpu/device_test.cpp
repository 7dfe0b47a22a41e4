// Device selection and feature detection: lavapipe's features where it is installed (CI), the
// selection rules on whatever devices there are (the H100 machine too).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <iostream>
#include <optional>
#include <thread>

#include "gpu/device.hpp"
#include "gpu/kernel_library.hpp"
#include "gpu/vulkan_error.hpp"
#include "gpu_fixture.hpp"

namespace mqlm::gpu {
namespace {

TEST(Device, PicksByNameSubstringOrIndexAndReportsLavapipeFeatures) {
  std::optional<Device> lavapipe;
  try {
    lavapipe.emplace(DeviceOptions{"LLVMPIPE", false});
  } catch (const GpuError&) {
    GTEST_SKIP() << "no lavapipe device on this machine";
  }
  const Device& by_name = *lavapipe;
  const auto& f = by_name.features();
  EXPECT_NE(f.name.find("llvmpipe"), std::string::npos);
  EXPECT_EQ(f.subgroup_size, 8u);
  EXPECT_EQ(f.max_storage_buffer_range, 128u << 20);
  EXPECT_FALSE(f.cooperative_matrix.has_value());  // so the coopmat matmul is never chosen here
  EXPECT_NE(f.summary().find("cooperative matrix: none"), std::string::npos);
}

TEST(Device, PicksByIndex) {
  Device first(DeviceOptions{"0", false});
  Device again(DeviceOptions{"0", false});
  EXPECT_FALSE(first.features().name.empty());
  EXPECT_EQ(again.features().name, first.features().name);
}

TEST(Device, AnUnknownSelectorSaysWhatExists) {
  const std::string first = Device(DeviceOptions{"0", false}).features().name;
  try {
    Device device(DeviceOptions{"no-such-gpu", false});
    FAIL() << "a device was created";
  } catch (const GpuError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("no-such-gpu"), std::string::npos);
    EXPECT_NE(what.find("0: " + first), std::string::npos) << what;
  }
  EXPECT_THROW(Device(DeviceOptions{"7", false}), GpuError);
}

// Asking for pipeline statistics never stops a device from being made: where the driver has
// VK_KHR_pipeline_executable_properties (NVIDIA's does) every pipeline built reports its
// executables' statistics; where it does not (lavapipe) the report is empty.
TEST(Device, PipelineStatisticsWhereTheDriverHasThem) {
  DeviceOptions options{"0", false};
  options.pipeline_statistics = true;
  Device device(options);
  KernelLibrary lib(device);
  lib.get({"copy", 2, 4, {}, 0});
  const std::string text = lib.pipeline_statistics();
  std::cout << device.features().name << ":\n" << text;
  if (device.features().pipeline_statistics) {
    EXPECT_EQ(text.rfind("copy//0 [", 0), 0u) << text;
    EXPECT_NE(text.find("\n  "), std::string::npos) << "no statistic reported";
  } else {
    EXPECT_EQ(text, "");
  }
}

// A saved pipeline cache seeds a library only if its header names this device and driver: data
// from elsewhere, cut short or garbled is refused with a reason, and the library still works.
TEST(Device, PipelineCacheDataIsCheckedBeforeUse) {
  auto& gpu = testing::shared_gpu();
  KernelLibrary first(gpu.device);
  first.get({"copy", 2, 4, {}, 0});
  const std::vector<std::uint8_t> saved = first.cache_data();
  ASSERT_GE(saved.size(), sizeof(VkPipelineCacheHeaderVersionOne));
  EXPECT_EQ(KernelLibrary::cache_data_problem(gpu.device, saved), "");

  auto other_device = saved;
  other_device[offsetof(VkPipelineCacheHeaderVersionOne, deviceID)] ^= 0x5a;
  EXPECT_NE(KernelLibrary::cache_data_problem(gpu.device, other_device).find("made for device"), std::string::npos);
  auto other_driver = saved;
  other_driver[offsetof(VkPipelineCacheHeaderVersionOne, pipelineCacheUUID)] ^= 0x01;
  EXPECT_EQ(KernelLibrary::cache_data_problem(gpu.device, other_driver), "made by another driver version");
  const std::vector<std::uint8_t> short_data(saved.begin(), saved.begin() + 7);
  EXPECT_NE(KernelLibrary::cache_data_problem(gpu.device, short_data).find("shorter"), std::string::npos);
  auto huge_header = saved;
  huge_header[0] = 0xff;
  huge_header[1] = 0xff;
  EXPECT_NE(KernelLibrary::cache_data_problem(gpu.device, huge_header).find("header size"), std::string::npos);

  for (const auto& data : {saved, other_device, short_data, huge_header}) {
    KernelLibrary lib(gpu.device, data);
    EXPECT_NE(lib.get({"copy", 2, 4, {}, 0}).pipeline(), VK_NULL_HANDLE);
  }
}

TEST(Device, MemoryFiguresSumTheDeviceLocalHeaps) {
  auto& gpu = testing::shared_gpu();
  const DeviceMemory before = gpu.device.memory_figures();
  std::cout << "device-local heaps: total " << before.total_bytes << ", budget " << before.budget_bytes << ", usage "
            << before.usage_bytes << (before.has_budget ? " (VK_EXT_memory_budget)" : " (no budget extension)")
            << "\n";
  EXPECT_GT(before.total_bytes, 0u);
  EXPECT_GE(before.total_bytes, gpu.device.features().device_local_bytes);  // the largest heap is one of them
  if (!before.has_budget) {  // lavapipe (Mesa 22): no VK_EXT_memory_budget
    EXPECT_EQ(before.budget_bytes, before.total_bytes);
    EXPECT_EQ(before.usage_bytes, 0u);
    return;
  }
  // The extension's rules: a heap's budget is never above its size.
  EXPECT_GT(before.budget_bytes, 0u);
  EXPECT_LE(before.budget_bytes, before.total_bytes);
  // A block of its own (the fixture's pool has 8 MiB blocks): the driver counts it in usage.
  constexpr VkDeviceSize kBytes = VkDeviceSize{64} << 20;
  PoolBuffer buffer = gpu.pool.allocate(kBytes, "memory figures test");
  const DeviceMemory after = gpu.device.memory_figures();
  EXPECT_GE(after.usage_bytes, before.usage_bytes + kBytes * 3 / 4)
      << "usage " << before.usage_bytes << " -> " << after.usage_bytes;
  buffer.reset();
  gpu.pool.trim();
}

// The queue's timeline: each submission's GPU time, and the idle gap before a submission the host
// sent after the GPU had drained, by that submission's label.
TEST(ComputeQueueTimeline, CountsBusyTimeAndTheGapBeforeALateSubmission) {
  auto& gpu = testing::shared_gpu();
  if (gpu.device.features().timestamp_period_ns <= 0) GTEST_SKIP() << "no timestamps on this device";
  gpu.queue.enable_timeline();
  const QueueTimeline before = gpu.queue.timeline();
  PoolBuffer buffer = gpu.pool.allocate(VkDeviceSize{4} << 20, "timeline test");
  auto fill = [&](const char* label) {
    Recording rec = gpu.queue.begin();
    rec.set_label(label);
    rec.fill(buffer.range(), 7);
    gpu.queue.submit_and_wait(rec);
  };
  fill("first");
  std::this_thread::sleep_for(std::chrono::milliseconds(15));
  fill("late");
  const QueueTimeline& after = gpu.queue.timeline();
  EXPECT_EQ(after.submissions, before.submissions + 2);
  EXPECT_GT(after.busy_ms, before.busy_ms);
  // The GPU idled while this thread slept: most of the 15 ms, never more than the wall time.
  const double late = after.starved_by_label.contains("late") ? after.starved_by_label.at("late") : 0.0;
  EXPECT_GT(late, 5.0);
  EXPECT_LT(late, QueueTimeline::idle_ms);
  EXPECT_GE(after.starved_submissions, before.starved_submissions + 1);
}

}  // namespace
}  // namespace mqlm::gpu
