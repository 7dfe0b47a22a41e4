// Compute pipelines built from the embedded SPIR-V: one Kernel per (shader, specialization
// constants), created on first use through one VkPipelineCache. Buffers are bound with push
// descriptors (binding i = the i-th buffer), parameters go in push constants.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/device_handle.hpp"

namespace mqlm::gpu {

struct KernelSpec {
  std::string shader;                        // a name from shaders/CMakeLists.txt
  std::uint32_t buffers = 0;                 // storage buffers at bindings 0 .. buffers-1
  std::uint32_t push_bytes = 0;              // size of the push-constant block
  std::vector<std::uint32_t> constants;      // specialization constants with ids 0, 1, ...
  std::uint32_t required_subgroup_size = 0;  // 0: any
};

class Kernel {
 public:
  Kernel(const Device& device, VkPipelineCache cache, const KernelSpec& spec);
  VkPipeline pipeline() const { return pipeline_.get(); }
  VkPipelineLayout layout() const { return layout_.get(); }
  const KernelSpec& spec() const { return spec_; }

 private:
  KernelSpec spec_;
  UniqueDescriptorSetLayout set_layout_;
  UniquePipelineLayout layout_;
  UniquePipeline pipeline_;
};

class KernelLibrary {
 public:
  // `cache_data`: a pipeline cache saved by cache_data() on an earlier run (may be empty). Data
  // whose header does not name this device and driver (cache_data_problem) is not used.
  explicit KernelLibrary(const Device& device, const std::vector<std::uint8_t>& cache_data = {});
  // Why `data` cannot seed this device's pipeline cache ("" if it can): its header (version one:
  // size, version, vendor, device, the driver's cache UUID) is checked, since drivers are not
  // required to survive data made elsewhere.
  static std::string cache_data_problem(const Device& device, const std::vector<std::uint8_t>& data);
  const Kernel& get(const KernelSpec& spec);
  std::vector<std::uint8_t> cache_data() const;
  const Device& device() const { return device_; }

  // With DeviceFeatures::pipeline_statistics: for every pipeline built so far, what the driver
  // reports of its executables (one block of "name: value" lines each; NVIDIA's: registers, binary
  // and shared memory size). Empty without.
  std::string pipeline_statistics() const;

  // Whether the device's cooperative-matrix fragments are laid out as the direct matmul builds them,
  // so that it may run: unknown until probe_fragment_layout (gpu/fragment_layout.hpp) records it.
  std::optional<bool> direct_fragments() const { return direct_fragments_; }
  void set_direct_fragments(bool matches) { direct_fragments_ = matches; }

 private:
  const Device& device_;
  UniquePipelineCache cache_;
  std::map<std::string, std::unique_ptr<Kernel>> kernels_;
  std::optional<bool> direct_fragments_;
};

}  // namespace mqlm::gpu
