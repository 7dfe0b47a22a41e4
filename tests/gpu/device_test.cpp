// Device selection and feature detection on lavapipe.
#include <gtest/gtest.h>

#include "gpu/device.hpp"
#include "gpu/vulkan_error.hpp"

namespace mqlm::gpu {
namespace {

TEST(Device, PicksByNameSubstringOrIndexAndReportsLavapipeFeatures) {
  Device by_name(DeviceOptions{"LLVMPIPE", false});
  const auto& f = by_name.features();
  EXPECT_NE(f.name.find("llvmpipe"), std::string::npos);
  EXPECT_EQ(f.subgroup_size, 8u);
  EXPECT_EQ(f.max_storage_buffer_range, 128u << 20);
  EXPECT_FALSE(f.cooperative_matrix.has_value());  // so the coopmat matmul is never chosen here
  EXPECT_NE(f.summary().find("cooperative matrix: none"), std::string::npos);
  Device by_index(DeviceOptions{"0", false});
  EXPECT_EQ(by_index.features().name, f.name);
}

TEST(Device, AnUnknownSelectorSaysWhatExists) {
  try {
    Device device(DeviceOptions{"no-such-gpu", false});
    FAIL() << "a device was created";
  } catch (const GpuError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("no-such-gpu"), std::string::npos);
    EXPECT_NE(what.find("0: llvmpipe"), std::string::npos);
  }
  EXPECT_THROW(Device(DeviceOptions{"7", false}), GpuError);
}

}  // namespace
}  // namespace mqlm::gpu
