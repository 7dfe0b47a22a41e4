#include "gpu/device.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gpu/vulkan_error.hpp"

namespace mqlm::gpu {

std::string_view result_name(VkResult result) {
  switch (result) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST (the GPU hung or crashed)";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER (no Vulkan driver: is an ICD installed?)";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "an unnamed VkResult (see vulkan_core.h)";
  }
}

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  std::uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance, &count, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devices(count);
  check(vkEnumeratePhysicalDevices(instance, &count, devices.data()), "vkEnumeratePhysicalDevices");
  if (devices.empty()) throw GpuError("no Vulkan device found (install a Vulkan driver, e.g. mesa-vulkan-drivers)");
  return devices;
}

std::vector<std::string> device_extensions(VkPhysicalDevice physical) {
  std::uint32_t count = 0;
  vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, nullptr);
  std::vector<VkExtensionProperties> props(count);
  vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, props.data());
  std::vector<std::string> names;
  for (const auto& p : props) names.emplace_back(p.extensionName);
  return names;
}

bool has(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string device_type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    default: return "other";
  }
}

struct InstanceResult {
  VkInstance instance;
  bool validation;
};

InstanceResult create_instance(bool validation) {
  VkApplicationInfo app{};
  app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
  app.pApplicationName = "mqlm";
  app.apiVersion = VK_API_VERSION_1_3;
  std::vector<const char*> layers, extensions;
  if (validation) {
    std::uint32_t count = 0;
    vkEnumerateInstanceLayerProperties(&count, nullptr);
    std::vector<VkLayerProperties> props(count);
    vkEnumerateInstanceLayerProperties(&count, props.data());
    bool found = std::any_of(props.begin(), props.end(),
                             [](const auto& p) { return std::strcmp(p.layerName, "VK_LAYER_KHRONOS_validation") == 0; });
    if (found) {
      layers.push_back("VK_LAYER_KHRONOS_validation");
      extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    } else {
      spdlog::warn("validation asked for, but VK_LAYER_KHRONOS_validation is not installed (vulkan-validationlayers)");
      validation = false;
    }
  }
  VkInstanceCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
  info.pApplicationInfo = &app;
  info.enabledLayerCount = static_cast<std::uint32_t>(layers.size());
  info.ppEnabledLayerNames = layers.data();
  info.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
  info.ppEnabledExtensionNames = extensions.data();
  VkInstance instance = VK_NULL_HANDLE;
  check(vkCreateInstance(&info, nullptr, &instance), "vkCreateInstance (is a Vulkan loader and driver installed?)");
  return {instance, validation};
}

VKAPI_ATTR VkBool32 VKAPI_CALL log_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                              VkDebugUtilsMessageTypeFlagsEXT, const VkDebugUtilsMessengerCallbackDataEXT* data,
                                              void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    spdlog::error("vulkan validation: {}", data->pMessage);
  } else {
    spdlog::warn("vulkan validation: {}", data->pMessage);
  }
  return VK_FALSE;
}

VkPhysicalDevice pick(VkInstance instance, const std::string& selector) {
  auto devices = physical_devices(instance);
  auto name_of = [](VkPhysicalDevice d) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(d, &p);
    return p;
  };
  if (selector.empty()) {
    for (auto d : devices) {
      if (name_of(d).deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) return d;
    }
    return devices.front();
  }
  if (std::all_of(selector.begin(), selector.end(), [](unsigned char c) { return std::isdigit(c); })) {
    std::size_t index = std::stoul(selector);
    if (index < devices.size()) return devices[index];
  } else {
    for (auto d : devices) {
      if (lower(name_of(d).deviceName).find(lower(selector)) != std::string::npos) return d;
    }
  }
  std::string known;
  for (std::size_t i = 0; i < devices.size(); ++i) known += fmt::format("\n  {}: {}", i, name_of(devices[i]).deviceName);
  throw GpuError(fmt::format("no Vulkan device matches '{}' (MQLM_VULKAN_DEVICE takes an index or a name substring); devices:{}",
                             selector, known));
}

// The F16 x F16 + F32 subgroup shapes with M = K = 16 the device lists: N = 16 and N = 8.
struct NvShapes {
  bool n16 = false, n8 = false;
};
NvShapes nv_cooperative_matrix(VkInstance instance, VkPhysicalDevice physical) {
  NvShapes shapes;
  auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (get == nullptr) return shapes;
  std::uint32_t count = 0;
  get(physical, &count, nullptr);
  VkCooperativeMatrixPropertiesNV blank{};
  blank.sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
  std::vector<VkCooperativeMatrixPropertiesNV> props(count, blank);
  get(physical, &count, props.data());
  for (const auto& p : props) {
    bool types = p.AType == VK_COMPONENT_TYPE_FLOAT16_NV && p.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                 p.CType == VK_COMPONENT_TYPE_FLOAT32_NV && p.DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                 p.scope == VK_SCOPE_SUBGROUP_NV;
    if (!types || p.MSize != 16 || p.KSize != 16) continue;
    shapes.n16 = shapes.n16 || p.NSize == 16;
    shapes.n8 = shapes.n8 || p.NSize == 8;
  }
  return shapes;
}

}  // namespace

std::string DeviceFeatures::summary() const {
  std::string cm = cooperative_matrix ? fmt::format("NV {}x{}x{}", cooperative_matrix->m, cooperative_matrix->n,
                                                    cooperative_matrix->k)
                                      : std::string("none");
  return fmt::format(
      "{} (driver {}, Vulkan {}): subgroup {}, max storage buffer range {} MiB, shared memory {} KiB, "
      "device-local {:.1f} GiB, cooperative matrix: {}{}, integer dot product: {}, bfloat16: {}{}",
      name, driver, api_version, subgroup_size, max_storage_buffer_range >> 20, max_shared_memory >> 10,
      device_local_bytes / double(1ull << 30), cm, cooperative_matrix_khr ? " (KHR reported)" : "",
      integer_dot_product ? "yes" : "no", bfloat16 ? "yes" : "no", sm_count ? fmt::format(", {} SMs", sm_count) : "");
}

std::vector<std::string> Device::list_devices() {
  auto [instance, validation] = create_instance(false);
  std::unique_ptr<VkInstance_T, InstanceDeleter> owner(instance);
  std::vector<std::string> out;
  auto devices = physical_devices(instance);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(devices[i], &p);
    out.push_back(fmt::format("{}: {} ({})", i, p.deviceName, device_type_name(p.deviceType)));
  }
  return out;
}

namespace {

// A messenger that logs what the validation layers report (warnings and errors).
std::unique_ptr<VkDebugUtilsMessengerEXT_T, std::function<void(VkDebugUtilsMessengerEXT)>> validation_messenger(
    VkInstance instance) {
  auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
  auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
  VkDebugUtilsMessengerCreateInfoEXT info{};
  info.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
  info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  info.pfnUserCallback = log_validation;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  check(create(instance, &info, nullptr, &messenger), "vkCreateDebugUtilsMessengerEXT");
  return {messenger, [instance, destroy](VkDebugUtilsMessengerEXT m) { destroy(instance, m, nullptr); }};
}

// Integer dot products: core in Vulkan 1.3, an extension before; queried below and used only
// when the device enables them.
struct DotProductSupport {
  bool core = false, extension = false;
};

// What the device reports of itself (its properties and the extensions it lists) into features;
// returns its properties. Throws GpuError on a device older than Vulkan 1.2 or without push
// descriptors.
VkPhysicalDeviceProperties read_properties(VkInstance instance, VkPhysicalDevice physical,
                                           const std::vector<std::string>& extensions, DeviceFeatures& features,
                                           VkPhysicalDeviceMemoryProperties& memory) {
  VkPhysicalDeviceDriverProperties driver{};
  driver.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
  // How many SMs run the workgroups (NVIDIA's VK_NV_shader_sm_builtins; 0 where the driver does not
  // say), for the device's summary.
  VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm_builtins{};
  sm_builtins.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV;
  if (has(extensions, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)) driver.pNext = &sm_builtins;
  VkPhysicalDeviceSubgroupProperties subgroup{};
  subgroup.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
  subgroup.pNext = &driver;
  VkPhysicalDeviceProperties2 props{};
  props.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  props.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(physical, &props);
  const auto& p = props.properties;
  if (p.apiVersion < VK_API_VERSION_1_2) {
    throw GpuError(fmt::format("{} supports Vulkan {}.{} only; mqlm needs 1.2 or newer", p.deviceName,
                               VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion)));
  }
  vkGetPhysicalDeviceMemoryProperties(physical, &memory);

  features.name = p.deviceName;
  features.driver = fmt::format("{} {}", driver.driverName, driver.driverInfo);
  features.api_version = fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion),
                                     VK_API_VERSION_PATCH(p.apiVersion));
  features.vendor_id = p.vendorID;
  features.device_id = p.deviceID;
  std::copy(std::begin(p.pipelineCacheUUID), std::end(p.pipelineCacheUUID), features.pipeline_cache_uuid.begin());
  features.discrete = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  features.subgroup_size = subgroup.subgroupSize;
  features.sm_count = sm_builtins.shaderSMCount;
  features.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  features.max_shared_memory = p.limits.maxComputeSharedMemorySize;
  features.max_workgroup_invocations = p.limits.maxComputeWorkGroupInvocations;
  features.max_workgroup_count_x = p.limits.maxComputeWorkGroupCount[0];
  features.storage_offset_alignment = p.limits.minStorageBufferOffsetAlignment;
  for (std::uint32_t h = 0; h < memory.memoryHeapCount; ++h) {
    if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      features.device_local_bytes = std::max<std::uint64_t>(features.device_local_bytes, memory.memoryHeaps[h].size);
  }
  features.bfloat16 = has(extensions, "VK_KHR_shader_bfloat16");
  features.cooperative_matrix_khr = has(extensions, "VK_KHR_cooperative_matrix");
  bool nv_coopmat = has(extensions, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) && subgroup.subgroupSize == 32;
  if (nv_coopmat) {
    const NvShapes shapes = nv_cooperative_matrix(instance, physical);
    // The shaders are built for these two; 16 columns where both are listed.
    if (shapes.n16) features.cooperative_matrix = CooperativeMatrixShape{16, 16, 16};
    else if (shapes.n8) features.cooperative_matrix = CooperativeMatrixShape{16, 8, 16};
    features.cooperative_matrix_16x8 = shapes.n8;
  }
  if (!has(extensions, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME)) {
    throw GpuError(fmt::format("{} lacks VK_KHR_push_descriptor, which mqlm's kernels are bound with", p.deviceName));
  }
  return p;
}

// Checks the required features: 8- and 16-bit storage and arithmetic (GGUF blocks), timeline
// semaphores (throws GpuError naming those missing); keeps in features the optional ones the
// device has (cooperative matrices, integer dot products). Returns whether it has shaderInt64.
VkBool32 check_features(VkPhysicalDevice physical, DotProductSupport dot_support, DeviceFeatures& features) {
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{};
  coopmat.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
  VkPhysicalDeviceShaderIntegerDotProductFeatures dot{};
  dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES;
  dot.pNext = features.cooperative_matrix ? static_cast<void*>(&coopmat) : nullptr;
  const bool dot_known = dot_support.core || dot_support.extension;
  VkPhysicalDeviceVulkan12Features f12{};
  f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  f12.pNext = dot_known ? static_cast<void*>(&dot) : dot.pNext;
  VkPhysicalDeviceVulkan11Features f11{};
  f11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f2{};
  f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  f2.pNext = &f11;
  vkGetPhysicalDeviceFeatures2(physical, &f2);
  std::vector<std::string> missing;
  if (!f11.storageBuffer16BitAccess) missing.push_back("storageBuffer16BitAccess");
  if (!f12.storageBuffer8BitAccess) missing.push_back("storageBuffer8BitAccess");
  if (!f12.shaderFloat16) missing.push_back("shaderFloat16");
  if (!f12.shaderInt8) missing.push_back("shaderInt8");
  if (!f12.timelineSemaphore) missing.push_back("timelineSemaphore");
  if (!f2.features.shaderInt16) missing.push_back("shaderInt16");
  if (!missing.empty()) {
    throw GpuError(fmt::format("{} lacks Vulkan features mqlm needs: {}", features.name, fmt::join(missing, ", ")));
  }
  if (features.cooperative_matrix && !coopmat.cooperativeMatrix) features.cooperative_matrix.reset();
  features.integer_dot_product = dot_known && dot.shaderIntegerDotProduct;
  features.float64 = f2.features.shaderFloat64;
  return f2.features.shaderInt64;
}

// The features the device is created with, chained: those required, and the optional ones
// features says it has. Not copied or moved: the chain points into itself.
struct EnabledFeatures {
  EnabledFeatures(const DeviceFeatures& features, VkBool32 int64) {
    coopmat.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
    coopmat.cooperativeMatrix = VK_TRUE;
    dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES;
    dot.pNext = features.cooperative_matrix ? static_cast<void*>(&coopmat) : nullptr;
    dot.shaderIntegerDotProduct = VK_TRUE;
    v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    v12.pNext = features.integer_dot_product ? static_cast<void*>(&dot) : dot.pNext;
    v12.storageBuffer8BitAccess = v12.shaderFloat16 = v12.shaderInt8 = v12.timelineSemaphore = VK_TRUE;
    v11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
    v11.pNext = &v12;
    v11.storageBuffer16BitAccess = VK_TRUE;
    all.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    all.pNext = &v11;
    all.features.shaderInt16 = VK_TRUE;
    all.features.shaderInt64 = int64;
    all.features.shaderFloat64 = features.float64;
    executables.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR;
    executables.pipelineExecutableInfo = VK_TRUE;
    if (features.pipeline_statistics) {
      executables.pNext = all.pNext;
      all.pNext = &executables;
    }
  }
  EnabledFeatures(const EnabledFeatures&) = delete;
  EnabledFeatures& operator=(const EnabledFeatures&) = delete;

  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{};
  VkPhysicalDeviceShaderIntegerDotProductFeatures dot{};
  VkPhysicalDeviceVulkan12Features v12{};
  VkPhysicalDeviceVulkan11Features v11{};
  VkPhysicalDeviceFeatures2 all{};
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executables{};
};

// The first queue family that runs compute work; throws GpuError where none does.
VkQueueFamilyProperties compute_family(VkPhysicalDevice physical, const std::string& name, std::uint32_t& index) {
  std::uint32_t family_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &family_count, nullptr);
  std::vector<VkQueueFamilyProperties> families(family_count);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &family_count, families.data());
  for (std::uint32_t i = 0; i < family_count; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      index = i;
      return families[i];
    }
  }
  throw GpuError(fmt::format("{} has no compute queue", name));
}

}  // namespace

Device::Device(const DeviceOptions& options) {
  bool validation = options.validation || env_flag("MQLM_VULKAN_VALIDATION");
  auto created = create_instance(validation);
  instance_.reset(created.instance);
  if (created.validation) messenger_ = validation_messenger(created.instance);

  std::string selector = options.selector;
  if (selector.empty()) {
    if (const char* env = std::getenv("MQLM_VULKAN_DEVICE")) selector = env;
  }
  physical_ = pick(instance_.get(), selector);
  auto extensions = device_extensions(physical_);
  const VkPhysicalDeviceProperties p = read_properties(instance_.get(), physical_, extensions, features_, memory_);
  DotProductSupport dot;
  dot.core = p.apiVersion >= VK_API_VERSION_1_3;
  dot.extension = !dot.core && has(extensions, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
  const VkBool32 int64 = check_features(physical_, dot, features_);
  features_.pipeline_statistics =
      options.pipeline_statistics && has(extensions, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  if (options.pipeline_statistics && !features_.pipeline_statistics) {
    spdlog::warn("{} lacks {}: no pipeline statistics", p.deviceName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }
  const EnabledFeatures enabled(features_, int64);

  if (compute_family(physical_, features_.name, queue_family_).timestampValidBits > 0) {
    features_.timestamp_period_ns = p.limits.timestampPeriod;
  }
  std::vector<const char*> enable = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
  if (features_.cooperative_matrix) enable.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  if (features_.integer_dot_product && dot.extension) enable.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
  if (features_.pipeline_statistics) enable.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  memory_budget_ = has(extensions, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  if (memory_budget_) enable.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  float priority = 1.0f;
  VkDeviceQueueCreateInfo queue_info{};
  queue_info.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
  queue_info.queueFamilyIndex = queue_family_;
  queue_info.queueCount = 1;
  queue_info.pQueuePriorities = &priority;
  VkDeviceCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
  info.pNext = &enabled.all;
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue_info;
  info.enabledExtensionCount = static_cast<std::uint32_t>(enable.size());
  info.ppEnabledExtensionNames = enable.data();
  VkDevice device = VK_NULL_HANDLE;
  check(vkCreateDevice(physical_, &info, nullptr, &device), fmt::format("vkCreateDevice on {}", p.deviceName));
  device_.reset(device);
  vkGetDeviceQueue(device, queue_family_, 0, &queue_);
  push_descriptor_set_ =
      reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetKHR"));
  if (push_descriptor_set_ == nullptr) throw GpuError("vkCmdPushDescriptorSetKHR is missing although its extension is enabled");
  spdlog::info("vulkan device: {}", features_.summary());
}

Device::~Device() = default;

std::uint32_t Device::memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required,
                                  VkMemoryPropertyFlags preferred) const {
  std::optional<std::uint32_t> fallback;
  for (std::uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
    if (!(type_bits & (1u << i))) continue;
    auto flags = memory_.memoryTypes[i].propertyFlags;
    if ((flags & required) != required) continue;
    if ((flags & preferred) == preferred) return i;
    if (!fallback) fallback = i;
  }
  if (fallback) return *fallback;
  throw GpuError(fmt::format("{} has no memory type with property flags {:#x}", features_.name, required));
}

VkMemoryPropertyFlags Device::memory_flags(std::uint32_t type) const { return memory_.memoryTypes[type].propertyFlags; }

DeviceMemory Device::memory_figures() const {
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{};
  budget.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT;
  VkPhysicalDeviceMemoryProperties2 properties{};
  properties.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2;
  // Chaining the budget structure without the extension enabled is invalid usage.
  properties.pNext = memory_budget_ ? &budget : nullptr;
  vkGetPhysicalDeviceMemoryProperties2(physical_, &properties);
  const VkPhysicalDeviceMemoryProperties& heaps = properties.memoryProperties;
  DeviceMemory figures;
  figures.has_budget = memory_budget_;
  for (std::uint32_t h = 0; h < heaps.memoryHeapCount; ++h) {
    if (!(heaps.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) continue;
    figures.total_bytes += heaps.memoryHeaps[h].size;
    figures.budget_bytes += memory_budget_ ? budget.heapBudget[h] : heaps.memoryHeaps[h].size;
    if (memory_budget_) figures.usage_bytes += budget.heapUsage[h];
  }
  return figures;
}

}  // namespace mqlm::gpu
