#include "gpu/compute_queue.hpp"

#include <array>
#include <chrono>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gpu/vulkan_error.hpp"

namespace mqlm::gpu {

Recording::Recording(ComputeQueue& queue, std::size_t slot, VkCommandBuffer command_buffer)
    : queue_(&queue), slot_(slot), command_buffer_(command_buffer) {}

Recording::Recording(Recording&& other) noexcept
    : queue_(std::exchange(other.queue_, nullptr)),
      slot_(other.slot_),
      command_buffer_(other.command_buffer_),
      has_commands_(other.has_commands_),
      skip_barrier_(other.skip_barrier_),
      label_(other.label_) {}

Recording::~Recording() {
  if (queue_ != nullptr) queue_->drop(slot_);
}

void Recording::barrier_if_needed() {
  if (queue_ == nullptr) throw GpuError("recording into a step that was already submitted");
  if (has_commands_ && !std::exchange(skip_barrier_, false)) {
    VkMemoryBarrier barrier{};
    barrier.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                            VK_ACCESS_TRANSFER_WRITE_BIT;
    auto stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(command_buffer_, stages, stages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  }
  has_commands_ = true;
}

void Recording::dispatch(const Kernel& kernel, std::initializer_list<BufferRange> buffers, const void* push,
                         std::uint32_t x, std::uint32_t y, std::uint32_t z) {
  if (buffers.size() != kernel.spec().buffers) {
    throw GpuError(fmt::format("kernel {} binds {} buffers, {} given", kernel.spec().shader, kernel.spec().buffers,
                               buffers.size()));
  }
  constexpr std::size_t kMaxBuffers = 16;  // on the stack: this runs hundreds of times a step
  if (buffers.size() > kMaxBuffers) throw GpuError(fmt::format("kernel {} binds more than 16 buffers", kernel.spec().shader));
  barrier_if_needed();
  std::array<VkDescriptorBufferInfo, kMaxBuffers> infos{};
  std::array<VkWriteDescriptorSet, kMaxBuffers> writes{};
  std::uint32_t count = 0;
  for (const auto& b : buffers) {
    infos[count] = {b.buffer, b.offset, b.size};
    VkWriteDescriptorSet& w = writes[count];
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstBinding = count;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &infos[count];
    ++count;
  }
  vkCmdBindPipeline(command_buffer_, VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline());
  queue_->device_.push_descriptor_set()(command_buffer_, VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout(), 0, count,
                                        writes.data());
  if (kernel.spec().push_bytes > 0) {
    vkCmdPushConstants(command_buffer_, kernel.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, kernel.spec().push_bytes, push);
  }
  vkCmdDispatch(command_buffer_, x, y, z);
}

void Recording::copy(BufferRange src, BufferRange dst) {
  if (src.size > dst.size) throw GpuError(fmt::format("copy of {} bytes into a range of {}", src.size, dst.size));
  barrier_if_needed();
  VkBufferCopy region{src.offset, dst.offset, src.size};
  vkCmdCopyBuffer(command_buffer_, src.buffer, dst.buffer, 1, &region);
}

void Recording::fill(BufferRange dst, std::uint32_t value) {
  if (dst.size % 4 != 0 || dst.offset % 4 != 0) {
    throw GpuError(fmt::format("fill of {} bytes at offset {}: not whole 32-bit words", dst.size, dst.offset));
  }
  barrier_if_needed();
  vkCmdFillBuffer(command_buffer_, dst.buffer, dst.offset, dst.size, value);
}

void Recording::update(BufferRange dst, std::span<const std::byte> data) {
  if (data.size() % 4 != 0 || dst.offset % 4 != 0 || data.size() > dst.size || data.size() > 65536) {
    throw GpuError(fmt::format("update of {} bytes at offset {} into a range of {}: whole words, at most 64 KiB",
                               data.size(), dst.offset, dst.size));
  }
  barrier_if_needed();
  vkCmdUpdateBuffer(command_buffer_, dst.buffer, dst.offset, data.size(), data.data());
}

void Recording::make_visible_to_host() {
  VkMemoryBarrier barrier{};
  barrier.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(command_buffer_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
}

void Recording::write_timestamp(VkQueryPool pool, std::uint32_t query) {
  barrier_if_needed();
  vkCmdWriteTimestamp(command_buffer_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, query);
}

ComputeQueue::ComputeQueue(const Device& device) : device_(device) {
  VkCommandPoolCreateInfo pool_info{};
  pool_info.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool_info.queueFamilyIndex = device.queue_family();
  VkCommandPool pool = VK_NULL_HANDLE;
  check(vkCreateCommandPool(device.get(), &pool_info, nullptr, &pool), "vkCreateCommandPool");
  pool_ = {device.get(), pool};

  VkSemaphoreTypeCreateInfo type{};

  type.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
  type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  VkSemaphoreCreateInfo sem_info{};
  sem_info.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
  sem_info.pNext = &type;
  VkSemaphore semaphore = VK_NULL_HANDLE;
  check(vkCreateSemaphore(device.get(), &sem_info, nullptr, &semaphore), "vkCreateSemaphore (timeline)");
  timeline_ = {device.get(), semaphore};
}

ComputeQueue::~ComputeQueue() {
  try {
    wait_idle();
  } catch (const GpuError& e) {
    spdlog::error("compute queue teardown: {}", e.what());
  }
}

Recording ComputeQueue::begin() {
  std::uint64_t done = completed();
  std::size_t slot = slots_.size();
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].recording && slots_[i].value <= done) {
      slot = i;
      break;
    }
  }
  if (slot == slots_.size()) {
    VkCommandBufferAllocateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    info.commandPool = pool_.get();
    info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    info.commandBufferCount = 1;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    check(vkAllocateCommandBuffers(device_.get(), &info, &cb), "vkAllocateCommandBuffers");
    slots_.push_back({cb, 0, false});
  }
  auto& s = slots_[slot];
  if (stamps_ && slot < kStampedSlots) read_stamps();  // the slot's last stamps, before they are reset
  check(vkResetCommandBuffer(s.command_buffer, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo begin{};
  begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(s.command_buffer, &begin), "vkBeginCommandBuffer");
  if (stamps_ && slot < kStampedSlots) {
    const auto query = static_cast<std::uint32_t>(2 * slot);
    vkCmdResetQueryPool(s.command_buffer, stamps_.get(), query, 2);
    vkCmdWriteTimestamp(s.command_buffer, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, stamps_.get(), query);
  }
  s.recording = true;
  ++open_recordings_;
  return Recording(*this, slot, s.command_buffer);
}

void ComputeQueue::drop(std::size_t slot) {
  auto& s = slots_[slot];
  if (!s.recording) return;
  vkEndCommandBuffer(s.command_buffer);
  s.recording = false;
  --open_recordings_;
}

std::uint64_t ComputeQueue::submit(Recording& recording, std::span<const TimelineWait> waits) {
  if (recording.queue_ != this) throw GpuError("submitting a recording that is not open on this queue");
  auto& s = slots_[recording.slot_];
  const bool stamped = stamps_ && recording.slot_ < kStampedSlots;
  if (stamped) recording.write_timestamp(stamps_.get(), static_cast<std::uint32_t>(2 * recording.slot_ + 1));
  check(vkEndCommandBuffer(s.command_buffer), "vkEndCommandBuffer");
  std::uint64_t value = last_submitted_ + 1;
  std::vector<VkSemaphore> wait_semaphores;
  std::vector<std::uint64_t> wait_values;
  std::vector<VkPipelineStageFlags> wait_stages;
  for (const auto& w : waits) {
    wait_semaphores.push_back(w.semaphore);
    wait_values.push_back(w.value);
    wait_stages.push_back(VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
  }
  VkSemaphore signal = timeline_.get();
  VkTimelineSemaphoreSubmitInfo timeline{};
  timeline.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
  timeline.waitSemaphoreValueCount = static_cast<std::uint32_t>(wait_values.size());
  timeline.pWaitSemaphoreValues = wait_values.data();
  timeline.signalSemaphoreValueCount = 1;
  timeline.pSignalSemaphoreValues = &value;
  VkSubmitInfo info{};
  info.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
  info.pNext = &timeline;
  info.waitSemaphoreCount = static_cast<std::uint32_t>(wait_semaphores.size());
  info.pWaitSemaphores = wait_semaphores.data();
  info.pWaitDstStageMask = wait_stages.data();
  info.commandBufferCount = 1;
  info.pCommandBuffers = &s.command_buffer;
  info.signalSemaphoreCount = 1;
  info.pSignalSemaphores = &signal;
  s.recording = false;
  --open_recordings_;
  recording.queue_ = nullptr;
  const bool starved = stamped && completed() >= last_submitted_;
  check(vkQueueSubmit(device_.queue(), 1, &info, VK_NULL_HANDLE), "vkQueueSubmit");
  s.value = value;
  last_submitted_ = value;
  if (stamped) stamped_.push_back({value, recording.slot_, recording.label_, starved});
  return value;
}

void ComputeQueue::enable_timeline() {
  const DeviceFeatures& features = device_.features();
  if (stamps_ || features.timestamp_period_ns <= 0) return;
  VkQueryPoolCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
  info.queryType = VK_QUERY_TYPE_TIMESTAMP;
  info.queryCount = 2 * kStampedSlots;
  VkQueryPool pool = VK_NULL_HANDLE;
  check(vkCreateQueryPool(device_.get(), &info, nullptr, &pool), "vkCreateQueryPool (queue timeline)");
  stamps_ = {device_.get(), pool};
  tick_ms_ = features.timestamp_period_ns / 1e6;
}

const QueueTimeline& ComputeQueue::timeline() {
  if (stamps_) read_stamps();
  return timeline_totals_;
}

// The completed submissions' stamps, in the order they ran.
void ComputeQueue::read_stamps() {
  const std::uint64_t done = completed();
  QueueTimeline& t = timeline_totals_;
  while (!stamped_.empty() && stamped_.front().value <= done) {
    const Stamped s = stamped_.front();
    stamped_.pop_front();
    std::array<std::uint64_t, 2> ticks{};
    if (vkGetQueryPoolResults(device_.get(), stamps_.get(), static_cast<std::uint32_t>(2 * s.slot), 2, sizeof(ticks),
                              ticks.data(), 8, VK_QUERY_RESULT_64_BIT) != VK_SUCCESS) {
      continue;
    }
    ++t.submissions;
    if (ticks[1] > ticks[0]) t.busy_ms += static_cast<double>(ticks[1] - ticks[0]) * tick_ms_;
    if (last_end_tick_ != 0 && ticks[0] > last_end_tick_) {
      const double gap = static_cast<double>(ticks[0] - last_end_tick_) * tick_ms_;
      if (!s.starved) {
        t.queued_gap_ms += gap;
      } else if (gap <= QueueTimeline::idle_ms) {
        t.starved_ms += gap;
        t.starved_by_label[s.label] += gap;
        ++t.starved_submissions;
      }
    }
    last_end_tick_ = std::max(last_end_tick_, ticks[1]);
  }
}

std::uint64_t ComputeQueue::submit_and_wait(Recording& recording) {
  auto value = submit(recording);
  wait(value);
  return value;
}

void ComputeQueue::block_until(std::uint64_t value) const {
  VkSemaphore semaphore = timeline_.get();
  VkSemaphoreWaitInfo info{};
  info.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO;
  info.semaphoreCount = 1;
  info.pSemaphores = &semaphore;
  info.pValues = &value;
  check(vkWaitSemaphores(device_.get(), &info, UINT64_MAX), fmt::format("waiting for GPU submission {}", value));
}

void ComputeQueue::wait(std::uint64_t value) const {
  if (value == 0 || completed() >= value) return;
  // A thread blocked on the semaphore wakes tens of microseconds after the GPU finishes, and the
  // GPU idles until the host has read the step's result and submitted the next: on a discrete GPU
  // the submissions before `value` are waited for blocked, the last one (a step's last part) by
  // polling for up to spin_limit (H100, llama3-8b decode polled throughout: GPU idle between steps
  // 0.36 -> 0.27 ms, the host's recording 1.34 -> 0.91 ms a token: its CPU stays clocked up).
  // Not on a CPU device (lavapipe), whose work would compete with the polling thread for cores.
  if (!device_.features().discrete) return block_until(value);
  if (value > 1) block_until(value - 1);
  constexpr auto spin_limit = std::chrono::milliseconds(1);
  const auto until = std::chrono::steady_clock::now() + spin_limit;
  while (std::chrono::steady_clock::now() < until) {
    if (completed() >= value) return;
  }
  block_until(value);
}

std::uint64_t ComputeQueue::completed() const {
  std::uint64_t value = 0;
  check(vkGetSemaphoreCounterValue(device_.get(), timeline_.get(), &value), "vkGetSemaphoreCounterValue");
  return value;
}

}  // namespace mqlm::gpu
