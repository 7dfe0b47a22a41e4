#include "gpu/kernel_library.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gpu/vulkan_error.hpp"
#include "shaders/embedded_shaders.hpp"

namespace mqlm::gpu {

Kernel::Kernel(const Device& device, VkPipelineCache cache, const KernelSpec& spec) : spec_(spec) {
  VkDevice dev = device.get();
  std::vector<VkDescriptorSetLayoutBinding> bindings(spec.buffers);
  for (std::uint32_t i = 0; i < spec.buffers; ++i) {
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo set_info{};
  set_info.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
  set_info.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  set_info.bindingCount = spec.buffers;
  set_info.pBindings = bindings.data();
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  check(vkCreateDescriptorSetLayout(dev, &set_info, nullptr, &set_layout), "vkCreateDescriptorSetLayout " + spec.shader);
  set_layout_ = {dev, set_layout};

  VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, spec.push_bytes};
  VkPipelineLayoutCreateInfo layout_info{};
  layout_info.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
  layout_info.setLayoutCount = 1;
  layout_info.pSetLayouts = &set_layout;
  layout_info.pushConstantRangeCount = spec.push_bytes > 0 ? 1 : 0;
  layout_info.pPushConstantRanges = &push;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  check(vkCreatePipelineLayout(dev, &layout_info, nullptr, &layout), "vkCreatePipelineLayout " + spec.shader);
  layout_ = {dev, layout};

  auto code = shaders::spirv(spec.shader);
  VkShaderModuleCreateInfo module_info{};
  module_info.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
  module_info.codeSize = code.size_bytes();
  module_info.pCode = code.data();
  VkShaderModule module = VK_NULL_HANDLE;
  check(vkCreateShaderModule(dev, &module_info, nullptr, &module), "vkCreateShaderModule " + spec.shader);
  UniqueShaderModule module_owner(dev, module);

  std::vector<VkSpecializationMapEntry> entries(spec.constants.size());
  for (std::uint32_t i = 0; i < entries.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo spec_info{static_cast<std::uint32_t>(entries.size()), entries.data(), spec.constants.size() * 4,
                                 spec.constants.data()};
  if (spec.required_subgroup_size != 0 && device.features().subgroup_size != spec.required_subgroup_size) {
    throw GpuError(fmt::format("kernel {} needs subgroups of {}; {} has {}", spec.shader, spec.required_subgroup_size,
                               device.features().name, device.features().subgroup_size));
  }
  VkComputePipelineCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
  info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = module;
  info.stage.pName = "main";
  info.stage.pSpecializationInfo = entries.empty() ? nullptr : &spec_info;
  info.layout = layout;
  if (device.features().pipeline_statistics) {
    info.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  }
  VkPipeline pipeline = VK_NULL_HANDLE;
  check(vkCreateComputePipelines(dev, cache, 1, &info, nullptr, &pipeline), "vkCreateComputePipelines " + spec.shader);
  pipeline_ = {dev, pipeline};
}

std::string KernelLibrary::cache_data_problem(const Device& device, const std::vector<std::uint8_t>& data) {
  VkPipelineCacheHeaderVersionOne header{};
  if (data.size() < sizeof header) return fmt::format("{} bytes, shorter than a cache header", data.size());
  std::memcpy(&header, data.data(), sizeof header);
  const DeviceFeatures& f = device.features();
  if (header.headerSize < sizeof header || header.headerSize > data.size()) {
    return fmt::format("a header size of {} in {} bytes", header.headerSize, data.size());
  }
  if (header.headerVersion != VK_PIPELINE_CACHE_HEADER_VERSION_ONE) {
    return fmt::format("header version {}", static_cast<int>(header.headerVersion));
  }
  if (header.vendorID != f.vendor_id || header.deviceID != f.device_id) {
    return fmt::format("made for device {:04x}:{:04x}, not {:04x}:{:04x}", header.vendorID, header.deviceID, f.vendor_id,
                       f.device_id);
  }
  if (!std::equal(f.pipeline_cache_uuid.begin(), f.pipeline_cache_uuid.end(), std::begin(header.pipelineCacheUUID))) {
    return "made by another driver version";
  }
  return "";
}

KernelLibrary::KernelLibrary(const Device& device, const std::vector<std::uint8_t>& cache_data) : device_(device) {
  const std::string problem = cache_data.empty() ? "" : cache_data_problem(device, cache_data);
  if (!problem.empty()) spdlog::warn("kernels: the saved pipeline cache is not used ({})", problem);
  const bool use = !cache_data.empty() && problem.empty();
  VkPipelineCacheCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO;
  info.initialDataSize = use ? cache_data.size() : 0;
  info.pInitialData = use ? cache_data.data() : nullptr;
  VkPipelineCache cache = VK_NULL_HANDLE;
  check(vkCreatePipelineCache(device.get(), &info, nullptr, &cache), "vkCreatePipelineCache");
  cache_ = {device.get(), cache};
}

const Kernel& KernelLibrary::get(const KernelSpec& spec) {
  std::string key = fmt::format("{}/{}/{}", spec.shader, fmt::join(spec.constants, ","), spec.required_subgroup_size);
  auto it = kernels_.find(key);
  if (it == kernels_.end()) it = kernels_.emplace(key, std::make_unique<Kernel>(device_, cache_.get(), spec)).first;
  return *it->second;
}

std::vector<std::uint8_t> KernelLibrary::cache_data() const {
  std::size_t size = 0;
  check(vkGetPipelineCacheData(device_.get(), cache_.get(), &size, nullptr), "vkGetPipelineCacheData");
  std::vector<std::uint8_t> data(size);
  check(vkGetPipelineCacheData(device_.get(), cache_.get(), &size, data.data()), "vkGetPipelineCacheData");
  data.resize(size);
  return data;
}

namespace {

template <class Fn>
Fn device_function(VkDevice device, const char* name) {
  auto fn = reinterpret_cast<Fn>(vkGetDeviceProcAddr(device, name));
  if (fn == nullptr) throw GpuError(std::string(name) + " is missing although its extension is enabled");
  return fn;
}

// Vulkan's two calls for a list: get(&count, nullptr), then get(&count, items) into structures of
// type `type`; `what` names the call in errors.
template <class T, class Get>
std::vector<T> enumerate(VkStructureType type, const char* what, Get get) {
  std::uint32_t count = 0;
  check(get(&count, nullptr), what);
  T blank{};
  blank.sType = type;
  std::vector<T> items(count, blank);
  check(get(&count, items.data()), what);
  return items;
}

std::vector<VkPipelineExecutablePropertiesKHR> executables(VkDevice device, VkPipeline pipeline) {
  constexpr const char* name = "vkGetPipelineExecutablePropertiesKHR";
  auto get = device_function<PFN_vkGetPipelineExecutablePropertiesKHR>(device, name);
  VkPipelineInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, nullptr, pipeline};
  return enumerate<VkPipelineExecutablePropertiesKHR>(
      VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR, name,
      [&](std::uint32_t* count, VkPipelineExecutablePropertiesKHR* items) { return get(device, &info, count, items); });
}

std::string statistic_value(const VkPipelineExecutableStatisticKHR& s) {
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: return std::to_string(s.value.i64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: return std::to_string(s.value.u64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: return fmt::format("{:g}", s.value.f64);
    default: return "?";
  }
}

}  // namespace

std::string KernelLibrary::pipeline_statistics() const {
  if (!device_.features().pipeline_statistics) return "";
  VkDevice dev = device_.get();
  constexpr const char* name = "vkGetPipelineExecutableStatisticsKHR";
  auto get = device_function<PFN_vkGetPipelineExecutableStatisticsKHR>(dev, name);
  std::string text;
  for (const auto& [key, kernel] : kernels_) {
    auto props = executables(dev, kernel->pipeline());
    for (std::uint32_t i = 0; i < props.size(); ++i) {
      text += fmt::format("{} [{}: {}, subgroup {}]\n", key, props[i].name, props[i].description, props[i].subgroupSize);
      VkPipelineExecutableInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, nullptr, kernel->pipeline(), i};
      const auto stats = enumerate<VkPipelineExecutableStatisticKHR>(
          VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR, name,
          [&](std::uint32_t* count, VkPipelineExecutableStatisticKHR* items) { return get(dev, &info, count, items); });
      for (const auto& s : stats) text += fmt::format("  {}: {}\n", s.name, statistic_value(s));
    }
  }
  return text;
}

}  // namespace mqlm::gpu
