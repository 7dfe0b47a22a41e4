// The Vulkan pipeline cache kept in a file between runs (executor option pipeline_cache=), so that
// a start makes the kernels' pipelines from it instead of compiling them all again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace mqlm::actors {

// The pipeline cache saved by an earlier run, if `path` names one (empty otherwise, or if it
// cannot be read: a warning, and the pipelines are made anew). The KernelLibrary checks its header.
std::vector<std::uint8_t> read_pipeline_cache(const std::filesystem::path& path);

// Writes the pipeline cache whole or not at all (a file beside it, then renamed over it); a
// failure (a full disk, say) is a warning: the next start makes the pipelines again.
void write_pipeline_cache(const std::filesystem::path& path, const std::vector<std::uint8_t>& data);

}  // namespace mqlm::actors
