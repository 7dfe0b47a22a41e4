// The Vulkan instance and the one device an executor uses: which physical device, what it can do
// (DeviceFeatures decides which kernels run), and its single compute queue.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

namespace mqlm::gpu {

struct DeviceOptions {
  // A device index or a case-insensitive substring of its name. Empty: the environment variable
  // MQLM_VULKAN_DEVICE, else the first discrete GPU, else the first device.
  std::string selector;
  // Khronos validation layers (also switched on by MQLM_VULKAN_VALIDATION=1).
  bool validation = false;
  // Capture the driver's statistics (registers, shared memory, ...) of every pipeline, where the
  // device has VK_KHR_pipeline_executable_properties: a diagnostic (`mqlm bench kernels
  // --pipeline-stats DIR`); some drivers skip their caches for such pipelines.
  bool pipeline_statistics = false;
};

// A tensor-core tile shape (M x N x K) for F16 x F16 + F32 at subgroup scope.
struct CooperativeMatrixShape {
  std::uint32_t m = 0, n = 0, k = 0;
};

struct DeviceFeatures {
  std::string name;
  std::string driver;      // driver name and version string
  std::string api_version;  // "1.3.230"
  std::uint32_t vendor_id = 0;
  std::uint32_t device_id = 0;
  std::array<std::uint8_t, VK_UUID_SIZE> pipeline_cache_uuid{};  // whose pipeline cache data fits
  bool discrete = false;
  std::uint32_t subgroup_size = 0;
  std::uint32_t sm_count = 0;  // SMs (VK_NV_shader_sm_builtins); 0 where the driver does not say
  std::uint64_t max_storage_buffer_range = 0;  // the largest range one descriptor may bind
  std::uint32_t max_shared_memory = 0;
  std::uint32_t max_workgroup_invocations = 0;
  std::uint32_t max_workgroup_count_x = 0;
  std::uint64_t storage_offset_alignment = 0;
  std::uint64_t device_local_bytes = 0;  // the largest device-local heap
  bool integer_dot_product = false;      // shaderIntegerDotProduct enabled: the int8 mat-vec for Q8_0 and Q4_0
  bool bfloat16 = false;                 // VK_KHR_shader_bfloat16 (reported; BF16 is converted in ALU)
  bool float64 = false;                  // shaderFloat64 enabled: the sampler sums weights in double
  bool cooperative_matrix_khr = false;   // VK_KHR_cooperative_matrix (reported; see cooperative_matrix)
  bool pipeline_statistics = false;      // asked for (DeviceOptions) and enabled
  // The shape the tensor-core matmul uses, when the device has VK_NV_cooperative_matrix with
  // F16 x F16 + F32 at subgroup scope and a subgroup size of 32. Empty on lavapipe.
  std::optional<CooperativeMatrixShape> cooperative_matrix;
  // 16x8x16 is listed as well: the direct matmul's tiles, which it builds element by element where
  // gpu/fragment_layout finds the driver's elements where it expects them (KernelLibrary::direct_fragments).
  bool cooperative_matrix_16x8 = false;
  float timestamp_period_ns = 0;  // 0 when the compute queue cannot write timestamps

  std::string summary() const;  // one line for logs and benchmark headers
};

// The device-local heaps, summed: what the memory enforcer weighs its ceiling against. Without
// VK_EXT_memory_budget the driver says nothing about use, so budget is the heaps' size and usage
// is 0; has_budget tells the two apart. On lavapipe the "device-local" heap is host memory.
struct DeviceMemory {
  std::uint64_t total_bytes = 0;   // the heaps' sizes
  std::uint64_t budget_bytes = 0;  // what this process may allocate before it risks failing or paging
  std::uint64_t usage_bytes = 0;   // what this process has allocated, as the driver counts it
  bool has_budget = false;         // VK_EXT_memory_budget answered budget and usage
};

class Device {
 public:
  explicit Device(const DeviceOptions& options = {});
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice get() const { return device_.get(); }
  VkPhysicalDevice physical() const { return physical_; }
  VkQueue queue() const { return queue_; }
  std::uint32_t queue_family() const { return queue_family_; }
  const DeviceFeatures& features() const { return features_; }
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_set() const { return push_descriptor_set_; }

  // A memory type among type_bits with all `required` flags, preferring one with `preferred`
  // too; throws GpuError if none has the required flags.
  std::uint32_t memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required,
                            VkMemoryPropertyFlags preferred = 0) const;
  VkMemoryPropertyFlags memory_flags(std::uint32_t type) const;

  // Asks the driver now (one vkGetPhysicalDeviceMemoryProperties2 call: cheap enough to sample
  // with every report), since budget and usage change as this and other processes allocate.
  DeviceMemory memory_figures() const;

  // Every physical device as "index: name (type)", for error messages and `--list`.
  static std::vector<std::string> list_devices();

 private:
  struct InstanceDeleter {
    void operator()(VkInstance instance) const { vkDestroyInstance(instance, nullptr); }
  };
  struct DeviceDeleter {
    void operator()(VkDevice device) const { vkDestroyDevice(device, nullptr); }
  };

  std::unique_ptr<VkInstance_T, InstanceDeleter> instance_;
  std::unique_ptr<VkDebugUtilsMessengerEXT_T, std::function<void(VkDebugUtilsMessengerEXT)>> messenger_;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  std::unique_ptr<VkDevice_T, DeviceDeleter> device_;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::uint32_t queue_family_ = 0;
  DeviceFeatures features_;
  VkPhysicalDeviceMemoryProperties memory_{};
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_set_ = nullptr;
  bool memory_budget_ = false;  // VK_EXT_memory_budget is enabled
};

}  // namespace mqlm::gpu
