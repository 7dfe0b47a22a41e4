// The memory this process holds as the kernel counts it, beside what the GPU driver reports: on
// a CPU device (lavapipe) and for host-visible staging, GPU allocations land here too.
#pragma once

#include <cstdint>

namespace mqlm::actors {

// This process's resident set size in bytes, from /proc/self/statm; 0 where that cannot be read
// (not Linux, or /proc not mounted), which callers take as "unknown", never as a figure.
std::uint64_t resident_set_bytes();

}  // namespace mqlm::actors
