// The SPIR-V of every compute shader in shaders/, compiled by glslc at build time and embedded.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace mqlm::shaders {

// The module built under `name` (see shaders/CMakeLists.txt); throws std::invalid_argument if none.
std::span<const std::uint32_t> spirv(std::string_view name);
std::vector<std::string_view> shader_names();

}  // namespace mqlm::shaders
