// Vulkan failures as exceptions that say which call failed and why.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <vulkan/vulkan.h>

namespace mqlm::gpu {

// A Vulkan call failed or the device lacks something mqlm needs.
struct GpuError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string_view result_name(VkResult result);

// Throws GpuError("<what>: <VK_ERROR_...>") unless result is VK_SUCCESS.
inline void check(VkResult result, std::string_view what) {
  if (result != VK_SUCCESS) throw GpuError(std::string(what) + " failed: " + std::string(result_name(result)));
}

}  // namespace mqlm::gpu
