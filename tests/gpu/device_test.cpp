// Device selection and feature detection: lavapipe's features where it is installed (CI), the
// selection rules on whatever devices there are (the H100 machine too).
#include <gtest/gtest.h>

#include <optional>

#include "gpu/device.hpp"
#include "gpu/vulkan_error.hpp"

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

}  // namespace
}  // namespace mqlm::gpu
